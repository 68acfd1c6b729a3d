# One image for every Podium service; the Deployment picks the module (python -m <svc>).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY podium ./podium
COPY podium_app ./podium_app
COPY orchestrator_svc ./orchestrator_svc
COPY subagent_svc ./subagent_svc
COPY reward_svc ./reward_svc
COPY learner_svc ./learner_svc
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home podium
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
ENV PYTHONUNBUFFERED=1
# Every service serves grpc.health.v1 here (the k8s probes); 0 would pick a free port.
ENV PODIUM_HEALTH_PORT=8081
EXPOSE 50051 8081
CMD ["python", "-m", "orchestrator_svc"]
