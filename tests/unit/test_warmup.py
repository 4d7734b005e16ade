"""The controller warms a system up until its round trip is steady, and records the GPU clocks
it sees (never sets them)."""

from specpilot.services.controller import pairing


def test_steady_needs_the_last_runs_close_to_their_median():
    assert not pairing.steady([1.0, 1.0])  # too few runs
    assert pairing.steady([5.0, 1.00, 1.01, 1.02])  # the first (a compile) is behind it
    assert not pairing.steady([1.0, 1.0, 1.1])  # 10 % apart
    assert pairing.steady([2.0, 2.05, 2.0], runs=3, spread=0.03)
    assert not pairing.steady([2.0, 2.07, 2.0], runs=3, spread=0.03)


def test_warm_up_runs_until_steady_within_its_bounds(monkeypatch):
    script = iter([9.0, 3.0, 1.5, 1.0, 1.01, 1.0, 1.0, 1.0])
    monkeypatch.setattr(pairing, "timed_generate", lambda sys_, reqs, batch=1: ([], [], next(script)))
    assert pairing.warm_up(None, [], least=1) == [9.0, 3.0, 1.5, 1.0, 1.01, 1.0]
    noisy = iter([1.0, 2.0] * 20)
    monkeypatch.setattr(pairing, "timed_generate", lambda sys_, reqs, batch=1: ([], [], next(noisy)))
    assert len(pairing.warm_up(None, [], least=1, most=5)) == 5  # never steady: stops at the cap
    flat = iter([1.0] * 20)
    monkeypatch.setattr(pairing, "timed_generate", lambda sys_, reqs, batch=1: ([], [], next(flat)))
    assert len(pairing.warm_up(None, [], least=4)) == 4  # steady at once, but at least `least` runs


def test_clocks_only_for_cuda_devices():
    assert pairing.gpu_clocks(["cpu:0", "cpu:1"]) == {}
