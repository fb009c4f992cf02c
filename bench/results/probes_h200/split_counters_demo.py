"""cf46cbd's decode_attention wrapper (one split-counters buffer per GPU) under concurrent streams, and after its
buffer is outgrown while a captured graph still uses it. Run from the repository root on a GPU:

    git show cf46cbd:qoq/runtime_cuda/attention.py > scratch/old_attention.py
    python bench/results/probes_h200/split_counters_demo.py   # -> ../ab_h200/split_counters_head_wrapper.json
"""
import importlib.util
import json
import sys

import torch

sys.path.insert(0, ".")  # the repository root
from qoq.runtime_cuda import attention_reference as ref  # noqa: E402
from tests.runtime_cuda.kv_inputs import decode_inputs  # noqa: E402

spec = importlib.util.spec_from_file_location("old_attention", "scratch/old_attention.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


res = {}
case = decode_inputs([4096] * 4, 8, 128, 4, "cuda", seed=5)
expected = ref.decode_attention(*case)
gate_stream, gate = torch.cuda.Stream(), torch.cuda.Event()
streams = [torch.cuda.Stream() for _ in range(4)]
torch.cuda.synchronize()
outs = []
for _ in range(10):
    with torch.cuda.stream(gate_stream):
        torch.cuda._sleep(2_000_000)
        gate.record()
    for stream in streams:
        stream.wait_event(gate)
        with torch.cuda.stream(stream):
            outs.append(old.decode_attention(*case, 4096, num_splits=8))
torch.cuda.synchronize()
res["concurrent_streams_rel_err"] = [round(rel(o, expected), 6) for o in outs]

q, k_pool, v_pool, table, seq_lens = decode_inputs([500, 1500], 2, 128, 4, "cuda", seed=7)
exp = ref.decode_attention(q, k_pool, v_pool, table, seq_lens)
old.decode_attention(q, k_pool, v_pool, table, seq_lens, 1500, num_splits=4)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = old.decode_attention(q, k_pool, v_pool, table, seq_lens, 1500, num_splits=4)
old._counter_buffer(q.device, 8192)  # a larger batch elsewhere outgrows the buffer the graph captured
junk = torch.full((4096,), 7, dtype=torch.int32, device="cuda")  # may take the freed block
graph.replay()
torch.cuda.synchronize()
res["graph_after_growth_rel_err"] = rel(out, exp)
res["junk_changed_elements"] = int((junk != 7).sum())
print(json.dumps(res))
