"""``podium train``: one job (:mod:`podium_app.train.job`), one learning loop (learner_svc's),
two places to run the learning services (:mod:`podium_app.train.services`):

* ``inproc://`` (the zero-setup default): reward_svc and learner_svc as asyncio tasks on the
  in-process bus;
* ``kafka://HOST:PORT``: each its own process against the broker.

The acting side (:mod:`podium_app.train.actor`), the held-out table
(:mod:`podium_app.train.evaluate`) and the report (:mod:`podium_app.train.report`) are the
same for both.
"""
