"""Issue 27's coverage workload, for ``gemsops trace``: the width-2048 Llama's training
step with AdamW in its foreach and fused forms, and HF generate on the small Llama,
greedy and with top-k sampling.

    gemsops trace --json trace.json --script .ci/coverage_workload.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location("gems_ci_steps", Path(__file__).with_name("steps.py"))
assert spec is not None and spec.loader is not None
steps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(steps)

model, inputs, _ = steps._build("llama508m")
for fused in (False, True):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=not fused, fused=fused)
    for _ in range(2):
        steps._step(model, inputs, opt)
    torch.cuda.synchronize()
    print(f"coverage workload: 508M step, AdamW {'fused' if fused else 'foreach'}", flush=True)
del model, inputs, opt
torch.cuda.empty_cache()

model, _, _ = steps._build("llama")
model.eval()
ids = torch.randint(0, 32000, (1, 32), generator=torch.Generator().manual_seed(2)).cuda()
with torch.no_grad():
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=True, top_k=50)
torch.cuda.synchronize()
print("coverage workload: generate, greedy and top-k", flush=True)
