"""Importing gemshal and gemsops does nothing: no detection, subprocess, file read or device."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import builtins, json, subprocess, sys, io
    events = []
    def hook(event, args):
        if event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn"):
            events.append(event)
        if event == "open" and isinstance(args[0], str) and args[0].endswith(".toml"):
            events.append("open " + args[0])
    import torch, triton  # the baseline: these may do what they like
    sys.addaudithook(hook)
    import gemshal, gemsops
    from gemshal import device, registry
    from gemsops import registry as ops_registry
    from gemsops import bench, cli, selftest  # submodules: no op module for them
    print(json.dumps({
        "events": events,
        "resolved": device._STATE is not None,
        "registry_loaded": registry._STATE.loaded,
        "ops_imported": [m for m in sys.modules if m.startswith("gemsops.ops.")],
        "interpret": triton.knobs.runtime.interpret,
    }))
    """
)


def test_import_detects_nothing() -> None:
    """A fresh interpreter importing both packages runs no subprocess, reads no tune file,
    resolves no device, loads no plugin and imports no kernel module, also when gemsops
    submodules are imported by name (``from gemsops import bench``)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "events": [],
        "resolved": False,
        "registry_loaded": False,
        "ops_imported": [],
        "interpret": False,
    }
