"""``podium deploy local --check-only``: exit 0 on the dev overlay, 1 with each problem on its
own line for a broken one, 2 naming the bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium_app.cli import main

UNREAD = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: reward}
spec:
  template:
    spec:
      containers:
        - name: reward
          env:
            - {name: PODIUM_REWARD_GROUPS, value: reward_svc}
"""


def test_check_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = ["--work-dir", str(tmp_path / "w")]
    assert main(["deploy", "local", "--overlay", "dev", "--check-only", *work]) == 0
    assert "every env var is read by a config" in capsys.readouterr().out
    patch = tmp_path / "unread.yaml"
    patch.write_text(UNREAD)
    code = main(["deploy", "local", "--check-only", "--patch", str(patch), *work])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [
        "podium deploy local: check failed:",
        "  - reward-0/reward: PODIUM_REWARD_GROUPS is set but read by no config (not an env() "
        "field of podium/ or a service, nor a standard OTEL_* variable)",
    ]
    assert main(["deploy", "local", "--overlay", "nope", "--check-only", *work]) == 2
    assert "overlay 'nope': no kustomization.yaml" in capsys.readouterr().err
