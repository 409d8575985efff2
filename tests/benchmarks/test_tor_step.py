"""benchmarks/tor_step.py: the CPU clock it times steps with (the run itself trains the tor
pipeline's policy, which tests/pipelines/tor and tests/rollout cover)."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tor_step.py"
spec = importlib.util.spec_from_file_location("bench_tor_step", SCRIPT)
tor_step = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tor_step
spec.loader.exec_module(tor_step)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads children from /proc")
def test_cpu_seconds_count_a_running_childs_cpu():
    """A reward worker answers each step synchronously, so its CPU time is the step's too."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.process_time() + 0.4\n"
            "while time.process_time() < end: pass\ntime.sleep(30)",
        ]
    )
    try:
        before = tor_step.cpu_seconds()
        mine = time.process_time()
        deadline = time.monotonic() + 20
        while tor_step.cpu_seconds() - before - (time.process_time() - mine) < 0.2:
            assert time.monotonic() < deadline, "the child's CPU time never showed"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
