"""Serving the orchestrator policy: ONNX export, the Triton model repository, policy backends.

Modules (import them directly; this package imports nothing, so the MLServer adapter can load
:mod:`podium.serving.mlserver_onnx` in MLServer's own virtual environment, which has no torch
but has tritonclient, a dependency of MLServer):

- :mod:`podium.serving.pbtxt`: read and write Triton ``config.pbtxt`` with protobuf's text format
  against Triton's own ``ModelConfig`` message (``tritonclient.grpc.model_config_pb2``).
- :mod:`podium.serving.contract`: the policy's tensor signature and its validation (numpy), the
  policy's ``config.pbtxt``.
- :mod:`podium.serving.export`: torch module -> ``<repo>/<model>/<version>/model.onnx``.
- :mod:`podium.serving.backends`: ``LocalPolicy`` (torch), ``ServedPolicy`` (tritonclient over
  KServe-V2 gRPC) and :func:`~podium.serving.backends.make_policy_backend`.
- :mod:`podium.serving.mlserver_onnx`: the MLServer runtime and repository that serve the
  Triton layout with onnxruntime on CPU machines.

See ``docs/serving.md``.
"""
