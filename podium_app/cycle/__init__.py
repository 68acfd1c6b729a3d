"""``podium bench cycle``: a drift scenario through the safe-shipping cycle over Kafka, with the
services as processes — a live policy improved by the learner and the rollout controller
against a frozen one and the rule engines (docs/cycle.md).

* :mod:`~podium_app.cycle.config`: the settings and their checks;
* :mod:`~podium_app.cycle.measure`: the planned sessions, the rule engines' reference, the
  windows and the verdicts (pure);
* :mod:`~podium_app.cycle.deploy`: the broker, the service processes, the operator override;
* :mod:`~podium_app.cycle.load`: the load and the tail;
* :mod:`~podium_app.cycle.driver`: the two runs end to end;
* :mod:`~podium_app.cycle.report`: ``report.html`` and its plot.
"""
