"""The decode step's split-K linear (cuda_ops/decode_linear.py) against F.linear in fp32 (CUDA, or
Triton's interpreter on the CPU): odd row, column and K counts (K not a multiple of BLOCK_K, splits
that leave a short last chunk), bias or none, GELU in the epilogue, one split or several merged by
the last program of each tile; the merge is deterministic and leaves its counters at zero."""

from __future__ import annotations

import json

import pytest
import torch

from cuda_ops import decode_linear as dl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BIG = DEVICE == "cuda"


def _inputs(m, n, k, seed, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).half().to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).half().to(DEVICE)
    b = torch.randn(n, generator=gen).half().to(DEVICE) if bias else None
    return x, w, b


@pytest.mark.parametrize("m,n,k,launch", [
    (1, 96, 64, dl.GemmLaunch(16, 32, 32, 1)),
    (3, 200, 200, dl.GemmLaunch(16, 64, 64, 3)),  # K = 3 full steps + 8: the last split is short
    (17, 130, 96, dl.GemmLaunch(16, 32, 16, 4, num_warps=2)),  # two row tiles, a ragged column tile
    (40, 64, 384, dl.GemmLaunch(64, 16, 32, 5)),  # 12 steps in 5 splits: chunks of 3, the last one empty-free
    ((128, 1280, 1280, dl.GemmLaunch(64, 64, 64, 4)) if BIG else (33, 48, 160, dl.GemmLaunch(32, 16, 64, 2))),
])
@pytest.mark.parametrize("bias,gelu", [(True, False), (False, False), (True, True)])
def test_kernel_equals_the_fp32_linear(m, n, k, launch, bias, gelu):
    x, w, b = _inputs(m, n, k, m * 1000 + n + k, bias)
    ours = dl.decode_linear_triton(x, w, b, gelu, launch)
    ref = dl.decode_linear_reference(x, w, b, gelu)
    assert ours.shape == (m, n) and ours.dtype == torch.float16
    torch.testing.assert_close(ours.float(), ref.float(), rtol=2e-3, atol=2e-3)


def test_split_merge_is_deterministic_and_resets_its_counters():
    x, w, b = _inputs(20, 96, 256, 7)
    launch = dl.GemmLaunch(32, 32, 32, 8)  # 3 column tiles x 8 splits
    first = dl.decode_linear_triton(x, w, b, False, launch)
    again = dl.decode_linear_triton(x, w, b, False, launch)
    assert torch.equal(first, again)
    assert int(dl._split_locks(x.device, 3)[:3].abs().sum()) == 0
    out = torch.full_like(first, 7.0)
    dl.decode_linear_triton(x[None], w, b, False, launch, out=out)  # leading dims flattened, in place
    assert torch.equal(out, first)


def test_rows_of_a_batch_do_not_depend_on_each_other():
    """A row's output is the same alone as in a batch (no row reads another's K-chunk)."""
    x, w, b = _inputs(9, 64, 128, 3)
    launch = dl.GemmLaunch(16, 32, 32, 2)
    full = dl.decode_linear_triton(x, w, b, True, launch)
    torch.testing.assert_close(dl.decode_linear_triton(x[4:5], w, b, True, launch), full[4:5], rtol=0, atol=1e-3)


def test_table_and_dispatch(tmp_path, monkeypatch):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"1280,1280": [[256, 64, 64, 64, 4, 4, 3], [32, 16, 64, 128, 8, 4, 4], [64]]}))
    table = dl.load_table(str(path))
    assert [rows for rows, _ in table[(1280, 1280)]] == [32, 64, 256]
    monkeypatch.setattr(dl, "LAUNCHES", table)
    monkeypatch.setattr(dl, "MODE", str(path))
    assert dl.choose_launch(8, 1280, 1280, 132) == dl.GemmLaunch(16, 64, 128, 8, 4, 4)
    assert dl.choose_launch(200, 1280, 1280, 132).split == 4
    assert dl.choose_launch(48, 1280, 1280, 132) is None  # [64]: cuBLAS from 33 to 64 rows
    assert dl.choose_launch(257, 1280, 1280, 132) is None and dl.choose_launch(8, 5120, 1280, 132) is None
    monkeypatch.setattr(dl, "MODE", "off")
    assert dl.choose_launch(8, 1280, 1280, 132) is None
    rule = dl.rule_launch(128, 1280, 1280, 132)
    assert rule.split > 1 and 2 * 20 * rule.split >= 132  # tiles x splits fill the SMs
    # Off CUDA (and where no launch applies) `linear` is F.linear, then the GELU kernel's reference.
    x, w, b = (t.cpu() for t in _inputs(5, 48, 64, 1))
    assert torch.equal(dl.linear(x, w, b), torch.nn.functional.linear(x, w, b))


def test_bad_shapes_are_refused():
    x, w, b = _inputs(4, 32, 64, 0)
    with pytest.raises(ValueError, match="need weight"):
        dl.decode_linear_triton(x, w[:, :32], b)
    with pytest.raises(ValueError, match="need weight"):
        dl.decode_linear_triton(x, w, b[:8])
    with pytest.raises(ValueError, match="bad launch"):
        dl.decode_linear_triton(x, w, b, launch=dl.GemmLaunch(8, 32, 32, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLASLt's GELU epilogue is CUDA's")
def test_gelu_epilogue_is_the_tanh_gelu_of_the_linear(monkeypatch):
    """STREAMER_GELU_EPILOGUE=tanh (an A/B): fc1 + GELU as one GEMM, within fp16 rounding of the
    tanh-approximated GELU of the fp32 linear, on an odd batch shape."""
    monkeypatch.setattr(dl, "GELU_EPILOGUE", "tanh")
    x = torch.randn(3, 37, 96, device="cuda", dtype=torch.float16)
    w = (torch.randn(200, 96, device="cuda") / 10).half()
    b = torch.randn(200, device="cuda").half()
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x.float(), w.float(), b.float()), approximate="tanh")
    torch.testing.assert_close(dl.linear(x, w, b, gelu=True).float(), want, rtol=2e-3, atol=2e-3)


def test_row_buckets_are_few_and_tight():
    """Eager linears run at `row_bucket(m)` rows: never fewer, at most 12.5 % more above 16 rows, the
    same for every m of a bucket, and 96 sizes up to BUCKET_ROWS_MAX (what `warm_linears` runs)."""
    sizes = dl.bucket_sizes()
    assert len(sizes) == 96 and sizes[:17] == list(range(1, 17)) + [18] and sizes[-1] == dl.BUCKET_ROWS_MAX
    for m in range(1, dl.BUCKET_ROWS_MAX + 1):
        b = dl.row_bucket(m)
        assert m <= b <= max(m, m * 1.125) and dl.row_bucket(b) == b
    assert set(map(dl.row_bucket, range(1, dl.BUCKET_ROWS_MAX + 1))) == set(sizes)


def test_bucketed_linear_keeps_rows_shape_and_values(monkeypatch):
    """The padded GEMM itself (what lean eager linears run on CUDA) on this machine: x's leading dims,
    each row's values as the unpadded linear's; `warm_linears` runs each bucket once per weight shape."""
    x, w, b = (t.cpu().float() for t in _inputs(3 * 37, 48, 64, 1))
    got = dl._bucketed_linear(x.view(3, 37, 64), w, b)
    assert got.shape == (3, 37, 48)
    torch.testing.assert_close(got.view(111, 48), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    calls = []
    monkeypatch.setattr(dl.F, "linear", lambda x, w, b=None: calls.append((x.shape[0], tuple(w.shape))))
    lins = [torch.nn.Linear(8, 4), torch.nn.Linear(8, 4), torch.nn.Linear(4, 8)]
    monkeypatch.setattr(dl._triton, "EAGER_OPS", "kernels")
    dl.warm_linears(lins, torch.device("cpu"))
    assert calls == []  # only with lean
    monkeypatch.setattr(dl._triton, "EAGER_OPS", "lean")
    dl.warm_linears(lins, torch.device("cpu"))
    assert sorted({shape for _, shape in calls}) == [(4, 8), (8, 4)]
    assert [m for m, shape in calls if shape == (4, 8)] == dl.bucket_sizes()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the row buckets apply to cuBLAS on CUDA")
def test_eager_linear_at_a_padded_row_count_equals_the_linear(monkeypatch):
    """With STREAMER_EAGER_OPS=lean an eager call of 3 x 37 = 111 rows runs at 112 rows: the same
    values as the unpadded GEMM (within fp16 rounding: cuBLAS may pick another kernel), with x's
    leading dims, GELU after (PyTorch's, the tensor being small)."""
    monkeypatch.setattr(dl._triton, "EAGER_OPS", "lean")
    x = torch.randn(3, 37, 96, device="cuda", dtype=torch.float16)
    w = (torch.randn(200, 96, device="cuda") / 10).half()
    b = torch.randn(200, device="cuda").half()
    want = torch.nn.functional.linear(x.float(), w.float(), b.float())
    got = dl.linear(x, w, b)
    assert got.shape == (3, 37, 200) and dl.row_bucket(111) == 112
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(dl.linear(x, w, b, gelu=True).float(), torch.nn.functional.gelu(want), rtol=2e-3, atol=2e-3)


def test_a_capture_warm_up_runs_the_ops_the_capture_does(monkeypatch):
    """Under `as_in_graphs` (the runner's warm-ups before a capture) lean eager ops are off, so the
    warm-up compiles and plans the kernels the graph then launches; they come back after it."""
    monkeypatch.setattr(dl._triton, "EAGER_OPS", "lean")
    assert dl._triton.lean_eager()
    with dl._triton.as_in_graphs():
        assert not dl._triton.lean_eager()
        with dl._triton.as_in_graphs():
            assert not dl._triton.lean_eager()
        assert not dl._triton.lean_eager()
    assert dl._triton.lean_eager()
    monkeypatch.setattr(dl._triton, "EAGER_OPS", "kernels")
    assert not dl._triton.lean_eager()
