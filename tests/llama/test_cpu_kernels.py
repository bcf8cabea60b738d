"""The CPU kernels specllm lets llama.cpp use on quantized weights. A native build on an Intel
Xeon with AMX compiles llama.cpp's AMX kernels in, which repack Q8_0 and k-quant weights at load
and then crash the process (SIGILL or SIGSEGV) on the first call of more than one token on some of
these machines; specllm loads weights without them (devices.amx_built_in). Models load in a
child process, so that a crash fails a test instead of ending the test session."""

import json
import subprocess
import sys

import llama_cpp
import numpy as np
from tiny_models import write_model

CALL = """
import json, sys
import numpy as np
from specllm.llama.model import Model

model = Model(sys.argv[1])
tokens = list(range(300, 308))
batched = model.eval(tokens, len(tokens)).copy()
model.truncate(0)
single = np.stack([model.eval([t], 1)[0].copy() for t in tokens])
print(json.dumps({"batched": batched.tolist(), "single": single.tolist()}))
"""


def test_a_quantized_models_batched_call_completes_and_matches_its_one_token_calls(tmp_path):
    path = write_model(tmp_path / "q8.gguf", weight_type="Q8_0")
    proc = subprocess.run([sys.executable, "-c", CALL, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit code {proc.returncode}: {proc.stderr[-2000:]}"
    rows = json.loads(proc.stdout.splitlines()[-1])
    batched, single = np.array(rows["batched"]), np.array(rows["single"])
    assert batched.shape == single.shape == (8, batched.shape[1])
    # the batched kernels sum in another order than the one-token ones: equal up to rounding
    assert np.allclose(batched, single, atol=1e-2 * single.std())


LOAD = """
import sys
import specllm.llama.model as model
from specllm.llama.log import set_verbose

model.amx_built_in = lambda: sys.argv[2] == "amx"
set_verbose(True)  # llama.cpp's log, which names each weight layout it considers
model.Model(sys.argv[1])
"""


def test_with_amx_built_in_weights_load_in_llamas_plain_layout_alone(tmp_path):
    """llama.cpp's log names the repacked layout (CPU_REPACK) where it considers it: never once AMX is
    built in, whose layout comes with it."""
    path = write_model(tmp_path / "q8.gguf", weight_type="Q8_0")
    logs = {}
    for build in ("amx", "no-amx"):
        proc = subprocess.run(
            [sys.executable, "-c", LOAD, str(path), build], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        logs[build] = proc.stderr
    assert "CPU_REPACK" not in logs["amx"]
    if b"REPACK = 1" in llama_cpp.llama_print_system_info():  # a build with repacked layouts (x86-64, Arm)
        assert "CPU_REPACK" in logs["no-amx"]
