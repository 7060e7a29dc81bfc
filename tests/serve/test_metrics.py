import threading

import pytest

from tandem.serve.metrics import Metrics


def test_render_counters_and_gauges_in_prometheus_text():
    m = Metrics(prefix="tandem_cloud")
    m.counter("tokens_total", "Target tokens.")
    m.gauge("sessions", "Open sessions.")
    m.inc("tokens_total", 3, mode="spec")
    m.inc("tokens_total", 2, mode="spec")
    m.inc("tokens_total", mode='dr"agon')
    m.set("sessions", 4)
    text = m.render()
    assert "# TYPE tandem_cloud_tokens_total counter" in text
    assert 'tandem_cloud_tokens_total{mode="spec"} 5' in text
    assert 'tandem_cloud_tokens_total{mode="dr\\"agon"} 1' in text
    assert "tandem_cloud_sessions 4\n" in text
    assert m.value("tokens_total", mode="spec") == 5


def test_misuse_is_refused():
    m = Metrics()
    m.counter("c", "c")
    m.gauge("g", "g")
    with pytest.raises(ValueError):
        m.inc("c", -1)
    with pytest.raises(ValueError):
        m.set("c", 2)
    with pytest.raises(KeyError):
        m.inc("nope")
    with pytest.raises(ValueError):
        m.gauge("c", "again as a gauge")


def test_thread_safe_increments():
    m = Metrics()
    m.counter("n", "n")

    def work():
        for _ in range(1000):
            m.inc("n")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.value("n") == 4000
