"""Serving the orchestrator policy: ONNX export, the Triton model repository, policy backends.

Modules (import them directly; this package imports nothing, so the MLServer adapter can load
:mod:`podium.serving.mlserver_onnx` in MLServer's own virtual environment, which has neither
torch nor tritonclient):

- :mod:`podium.serving.pbtxt`: read and write Triton ``config.pbtxt`` (stdlib only).
- :mod:`podium.serving.contract`: the policy's tensor signature and its validation (numpy).
- :mod:`podium.serving.export`: torch module -> ``<repo>/<model>/<version>/model.onnx``.
- :mod:`podium.serving.backends`: ``LocalPolicy`` (torch), ``ServedPolicy`` (tritonclient over
  KServe-V2 gRPC) and :func:`~podium.serving.backends.make_policy_backend`.
- :mod:`podium.serving.mlserver_onnx`: the MLServer runtime and repository that serve the
  Triton layout with onnxruntime on CPU machines.

See ``docs/serving.md``.
"""
