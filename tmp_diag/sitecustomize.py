import sys, time, functools
try:
    import torch
    from streamer.engine import runner as R
    from streamer.model import whisper as W
    from streamer.model import decoding as D
except Exception as e:
    print("DBG sitecustomize failed", e, file=sys.stderr)
else:
    T = {}
    import os
    SYNC = os.environ.get("DBG_SYNC", "1") == "1"
    def timed(name, fn):
        @functools.wraps(fn)
        def w(*a, **k):
            if torch.cuda.is_current_stream_capturing():
                return fn(*a, **k)
            SYNC and torch.cuda.synchronize(); t = time.perf_counter()
            out = fn(*a, **k)
            SYNC and torch.cuda.synchronize(); T[name] = T.get(name, 0) + time.perf_counter() - t
            return out
        return w
    for name in ("_encode", "_admit", "_decode", "_languages", "_record"):
        setattr(R.Runner, name, timed(name, getattr(R.Runner, name)))
    W.TextDecoder.write_cross_kv = timed("cross_kv", W.TextDecoder.write_cross_kv)
    W.TextDecoder.forward = timed("dec_forward", W.TextDecoder.forward)
    D.LogitRules.sample = timed("sample", D.LogitRules.sample)
    orig = R.Runner.step
    def step(self, encode, released=()):
        T.clear(); t = time.perf_counter()
        out = orig(self, encode, released)
        dt = time.perf_counter() - t
        if dt > 0.03:
            print(f"DBG slow step {dt:.3f} enc={[(r.id, r.priority.name, len(r.audio) if r.audio is not None else None, len(r.options.prompt or '')) for r in encode]} live={len(self.slots)} "
                  + " ".join(f"{k}={v*1000:.1f}" for k, v in T.items()), file=sys.stderr, flush=True)
        return out
    R.Runner.step = step
