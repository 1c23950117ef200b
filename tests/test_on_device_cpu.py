"""``--device N`` of ``selfcheck`` and ``bench``: the command again in a child that sees GPU N alone."""

from __future__ import annotations

import pytest

from cudattn._tools import on_device
from cudattn._tools.cli import main


def test_strip_device_and_visible_ids(monkeypatch):
    assert on_device.strip_device(["bench", "--device", "1", "--grid", "quick", "--device=2"]) == \
        ["bench", "--grid", "quick"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert on_device.visible_id(3) == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6")
    assert on_device.visible_id(1) == "6"
    with pytest.raises(ValueError, match="shows 2 GPU"):
        on_device.visible_id(2)


def test_rerun_runs_the_command_once_on_the_narrowed_gpu(monkeypatch):
    calls = []
    monkeypatch.delenv(on_device.MARK, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(on_device.subprocess, "run",
                        lambda cmd, env: calls.append((cmd, env)) or type("R", (), {"returncode": 7})())
    assert on_device.rerun(0, ["bench"], 2) is None  # device 0 needs no child
    assert on_device.rerun(2, ["bench", "--device", "2"], 2) == 2  # no such GPU
    assert on_device.rerun(1, ["bench", "--device", "1", "--iters", "3"], 2) == 7
    (cmd, env), = calls
    assert cmd[-4:] == ["cudattn", "bench", "--iters", "3"] and env["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv(on_device.MARK, "1")
    assert on_device.rerun(1, ["bench"], 2) is None  # the child itself goes on


@pytest.mark.parametrize("cmd", ["bench", "selfcheck"])
def test_device_beyond_the_machine_is_refused(cmd, capsys, monkeypatch):
    from cudattn._runtime import device as _device

    monkeypatch.delenv(on_device.MARK, raising=False)
    monkeypatch.setattr(_device, "gpu_count", lambda: 0)
    assert main([cmd, "--device", "3"]) == 2
    assert "--device 3: this machine has 0 GPU(s)" in capsys.readouterr().err
