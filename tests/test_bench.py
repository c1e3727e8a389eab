"""The bench's recording-overhead estimate: the median of paired ratios, so a load spike that hits
one repetition does not move it (a ratio of medians taken minutes apart would)."""

from __future__ import annotations

from diagnostics import bench


def test_paired_overhead_ignores_a_load_spike(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    calls = {"on": 0, "off": 0}

    def timed(name: str, seconds: float, spike_at: int | None = None):
        def call() -> int:
            calls[name] += 1
            clock[0] += seconds * (5.0 if calls[name] == spike_at else 1.0)  # the machine got busy once
            return 48

        return call

    # 2% slower with recording; the 3rd "on" call (a timed repetition) is hit by a 5x spike.
    on_rate, off_rate, overhead = bench._paired_overhead(timed("on", 1.02, spike_at=3), timed("off", 1.0), repeat=6)
    assert abs(overhead - 0.02) < 1e-9
    assert abs(off_rate - 48.0) < 1e-9 and abs(on_rate - 48 / 1.02) < 1e-9
    assert calls == {"on": 7, "off": 7}  # one warm-up each, then six back-to-back pairs
