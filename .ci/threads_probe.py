"""Forward and backward of the small Llama, torch against gemsops, with autograd's device
threads and without, over time and switch intervals (was the step's slowness threads or
the host path?).  PYTHONPATH=$PWD python3 .ci/threads_probe.py"""
import json, statistics, sys, threading, time, torch
sys.path.insert(0, ".ci")
import steps, gemsops
model, inputs, opt = steps._build("llama")
def parts(n=7, backward=True):
    fw, bw = [], []
    for _ in range(n):
        model.zero_grad(set_to_none=True); torch.cuda.synchronize()
        t = time.perf_counter(); loss = model(**inputs).loss; torch.cuda.synchronize(); t2 = time.perf_counter()
        if backward: loss.backward()
        else: del loss
        torch.cuda.synchronize()
        fw.append((t2 - t) * 1e3); bw.append((time.perf_counter() - t2) * 1e3)
    return round(statistics.median(fw), 2), round(statistics.median(bw), 2)
one = torch.autograd.set_multithreading_enabled
for side in ("torch", "gemsops"):
    ctx = gemsops.use_gems() if side == "gemsops" else steps._null()
    with ctx:
        with one(False):
            for _ in range(3): steps._step(model, inputs, opt)
            if side == "gemsops": steps._compiled(lambda: steps._step(model, inputs, opt))
            r = {"side": side, "A_one": parts()}
        r["B_multi"] = parts()
        with one(False):
            r["C_one_again"] = parts()
            r["D_forward_only"] = parts(backward=False)
        r["E_multi_again"] = parts()
        r["F_forward_only_after_multi"] = parts(backward=False)
        old = sys.getswitchinterval()
        sys.setswitchinterval(0.0002); r["G_multi_switch_0.2ms"] = parts()
        sys.setswitchinterval(0.1); r["H_multi_switch_100ms"] = parts()
        sys.setswitchinterval(old)
        r["threads"] = [t.name for t in threading.enumerate()]
        print(json.dumps(r), flush=True)
