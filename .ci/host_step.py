"""Per served overload, the host time of a small Llama training step on the CPU with
launches stubbed (gemshal.kernel.stub_launches): the loop this session iterated host
work on. Width 256, 4 layers, 16 tokens; median us per call and ms per step.

    python .ci/host_step.py
"""
import time, torch, transformers as tf, torch.nn.functional as F, collections
import gemsops
from gemsops import registry
from gemshal.kernel import stub_launches
torch.manual_seed(0)
cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
model = tf.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").to(torch.bfloat16)
ids = torch.randint(0, 32000, (1, 16)); tgt = ids.view(-1).clone()
def step():
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(input_ids=ids).logits.view(-1, 32000), tgt).backward()
# time each served kernel by wrapping registry._wrap's product
times = collections.defaultdict(list)
orig = registry._wrap
def timed(overload, fn, original):
    k = orig(overload, fn, original)
    def kernel(keyset, *a, **kw):
        t = time.perf_counter_ns()
        try: return k(keyset, *a, **kw)
        finally: times[overload].append(time.perf_counter_ns() - t)
    return kernel
registry._wrap = timed
with stub_launches(), gemsops.use_gems():
    for _ in range(3): step()
    times.clear()
    t = time.perf_counter()
    for _ in range(5): step()
    total = (time.perf_counter() - t) / 5 * 1e3
rows = sorted(((sum(v) / 5 / 1e6, len(v) // 5, sorted(v)[len(v)//2] / 1e3, k) for k, v in times.items()), reverse=True)
print(f"step {total:.1f} ms, served {sum(r[1] for r in rows)} calls, in kernels {sum(r[0] for r in rows):.1f} ms")
for ms, n, med, k in rows: print(f"{ms:7.2f} ms {n:4d}x  median {med:6.1f} us  {k}")
