"""New self-attention K/V into the slot cache (cuda_ops/kv_write.py) against the index assignment it
replaces (CUDA, or Triton's interpreter on the CPU): a copy, so equal bit for bit, on odd shapes
(one to 20 heads, head dims 16-128, one token or several per row, fp16 and fp32, a cache that is a
view of some slots, the head-split views of a QKV projection's output), and nothing else written."""

from __future__ import annotations

import pytest
import torch

from cuda_ops.kv_write import write_kv_reference, write_kv_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("B,T,H,Dh,dtype", [(1, 1, 1, 64, torch.float16), (5, 1, 6, 64, torch.float16),
                                            (3, 4, 20, 64, torch.float16), (2, 3, 3, 16, torch.float32),
                                            (7, 1, 2, 128, torch.float32),
                                            (256 if DEVICE == "cuda" else 17, 1, 20, 64, torch.float16)])
def test_write_equals_the_index_assignment(B, T, H, Dh, dtype):
    gen = torch.Generator().manual_seed(B * 100 + T)
    ctx, slots, start = 448, B + 3, 2
    qkv = torch.randn(B, T, 3 * H * Dh, generator=gen).to(dtype).to(DEVICE)  # the projection's output
    _, k, v = (t.view(B, T, H, Dh) for t in qkv.chunk(3, dim=-1))  # strided views, as the block has them
    cache = [torch.randn(slots, H, ctx, Dh, generator=gen).to(dtype).to(DEVICE) for _ in range(2)]
    expected = [c.clone() for c in cache]
    rows = torch.arange(B, device=DEVICE)[:, None].expand(B, T)  # as TextDecoder.forward makes them
    positions = torch.stack([torch.randperm(ctx, generator=gen)[:T] for _ in range(B)]).to(DEVICE)
    view = slice(start, start + B)  # the batch's slots: a view of the cache
    write_kv_reference(k, v, expected[0][view], expected[1][view], rows, positions)
    write_kv_triton(k, v, cache[0][view], cache[1][view], rows, positions)
    assert torch.equal(cache[0], expected[0]) and torch.equal(cache[1], expected[1])
    assert not torch.equal(expected[0][view], cache[0][view].clone().zero_())  # something was written


def test_bad_shapes_are_refused():
    k = torch.zeros(2, 1, 3, 64, device=DEVICE)
    cache = torch.zeros(4, 3, 16, 64, device=DEVICE)
    rows = torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="disagree"):
        write_kv_triton(k, k, torch.zeros(4, 2, 16, 64, device=DEVICE), cache, rows, rows)
    with pytest.raises(ValueError, match="rows and positions"):
        write_kv_triton(k, k, cache, cache, rows[:1], rows)
    with pytest.raises(ValueError, match="contiguous along the head dim"):
        write_kv_triton(torch.zeros(2, 1, 64, 3, device=DEVICE).transpose(2, 3), k, cache, cache, rows, rows)
