"""Podium's top floor: what composes the services into a product.

The ``podium`` command line and its commands, the training job (the learning services —
reward_svc and learner_svc's learning loop — as asyncio tasks over the in-process bus, or each
its own process over Kafka), the demo (all four services on one bus), the training report,
the process supervisor and the local-broker tooling.
It stands on the services and the library and may import both; nothing imports it.
"""
