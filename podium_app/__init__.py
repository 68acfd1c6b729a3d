"""Podium's top floor: what composes the services into a product.

The ``podium`` command line and its commands, the training drivers (embedded: every service as
an asyncio task over the in-process bus; distributed: every service its own process over
Kafka), the demo, the training report, the process supervisor and the local-broker tooling.
It stands on the services and the library and may import both; nothing imports it.
"""
