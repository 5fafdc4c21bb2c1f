"""What the processes of a served port tell each other (``porter.commands.serve.hosts``),
over a stand-in for JAX's coordination store: runs handed on in order, how each
ended, a process that fails alone, leaves or stops beating, and the shared folder.
(Two real processes serving over HTTP: tests/e2e/test_multiprocess_serve.py.)"""

import json
import threading
import time

import pytest

from porter.commands.serve import hosts
from porter.errors import UsageError
from porter.runtime import coordination, distributed


class Store:
    """JAX's key-value store as the processes see it: a key is set once; reading one
    waits until it is set or the time is up."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def put(self, key, value):
        with self.changed:
            assert key not in self.values, f"{key} set twice"
            self.values[key] = value
            self.changed.notify_all()

    def count(self, key):
        with self.changed:
            self.values[key] = str(int(self.values.get(key, 0)) + 1)
            return int(self.values[key])

    def look(self, key):
        return self.values.get(key)

    def departed(self, count):
        self.left = count

    def wait(self, key, seconds):
        with self.changed:
            self.changed.wait_for(lambda: key in self.values, timeout=seconds)
            return self.values.get(key)


@pytest.fixture
def store(monkeypatch):
    found = Store()
    for name in ("put", "count", "look", "wait", "departed"):
        monkeypatch.setattr(coordination, name, getattr(found, name))
    monkeypatch.setattr(distributed, "process_count", lambda: 2)
    monkeypatch.setattr(hosts, "BEAT_S", 0.02)
    return found


def test_runs_are_handed_on_in_order_and_settled_when_every_process_ended(store):
    followers = hosts.Followers()
    try:
        store.count("serve/beat/1")
        first = followers.publish("job", id="000001", settings={"prompt": "a fox"})
        assert json.loads(store.values["serve/run/1"]) == {
            "kind": "job", "id": "000001", "settings": {"prompt": "a fox"}}
        store.put("serve/ended/1/1", "done")
        assert followers.settle(first, ("done", None)) is None
        assert store.values["serve/verdict/1"] == "done"
        failed = followers.publish("warmup", index=0)
        store.put("serve/ended/2/1", "error: out of memory")
        assert followers.settle(failed, ("failed", "error: out of memory")) is None
        assert store.values["serve/verdict/2"] == "error: out of memory"
    finally:
        followers.close()
    assert json.loads(store.values["serve/run/3"]) == {"kind": "stop"}
    assert store.left == 2  # process 0 waited for the others to leave before it ends


def test_a_process_that_leaves_or_stops_beating_is_lost_once(store, monkeypatch):
    lost = []
    followers = hosts.Followers()
    followers.on_lost = lost.append
    store.put("serve/gone/1", "stopped by signal 15")
    sequence = followers.publish("job", id="000001", settings={})
    assert followers.settle(sequence, ("failed", "x")) == lost[0]  # no longer waits
    assert lost == ["process 1 of 2 left: stopped by signal 15"]

    monkeypatch.setenv("PORTER_SERVE_HEARTBEAT_S", "0.1")
    store.values.clear()
    silent = hosts.Followers()
    silent.on_lost = lost.append
    deadline = time.monotonic() + 5
    while len(lost) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lost[1] == ("process 1 of 2 stopped answering (no heartbeat for 0.1 s: its "
                       "process or host died)")
    assert "serve/run/1" not in store.values
    silent.close()
    assert "serve/run/1" not in store.values  # a lost process is told nothing more


def test_every_process_must_see_the_jobs_folder(store, tmp_path):
    # process 1 finds another server's mark where process 0 said it left its own
    (tmp_path / hosts.SEEN).write_text("another server's")
    store.put("serve/folder", json.dumps({"path": str(tmp_path), "mark": "1234"}))
    with pytest.raises(UsageError, match="this process does not see"):
        hosts._see_folder(1)
    answer = store.values["serve/sees/1"]
    assert answer == f"{tmp_path / hosts.SEEN} holds another server's mark"

    # process 0 is told, and refuses to load, naming the process
    store.values.clear()
    store.put("serve/sees/1", answer)
    followers = hosts.Followers()
    try:
        with pytest.raises(UsageError) as refused:
            followers.share_folder(tmp_path)
    finally:
        followers.close()
    assert refused.value.message == f"not every process sees {tmp_path}: process 1: {answer}"
    assert "filesystem every host mounts" in refused.value.hint
    assert json.loads(store.values["serve/folder"])["mark"] == \
        (tmp_path / hosts.SEEN).read_text()


def test_a_process_whose_run_failed_alone_leaves_and_one_that_failed_with_all_goes_on(
        store, monkeypatch):
    monkeypatch.setattr(hosts, "VERDICT_S", 0.1)
    ran = []

    def run(port, handed, warmups, say):
        ran.append(handed["id"])
        return "error: the prompt is too long" if handed["id"] != "3" else "done"
    monkeypatch.setattr(hosts, "_run", run)
    for sequence, job in enumerate(("1", "2", "3"), 1):
        store.put(f"serve/run/{sequence}", json.dumps({"kind": "job", "id": job}))
    store.put("serve/verdict/1", "error: the prompt is too long")  # failed everywhere
    store.put("serve/verdict/2", "done")  # failed here after its last collective
    store.put("serve/run/4", json.dumps({"kind": "stop"}))
    assert hosts._runs(None, 1, [], say=lambda message: None) == 0
    assert ran == ["1", "2", "3"]
    assert store.values["serve/ended/3/1"] == "done"

    store.values.clear()
    store.put("serve/run/1", json.dumps({"kind": "job", "id": "1"}))
    with pytest.raises(UsageError, match="run 1 failed on this process alone: error: "
                                         "the prompt is too long"):
        hosts._runs(None, 1, [], say=lambda message: None)


def test_a_run_that_failed_on_process_0_alone_ends_the_server_after_the_verdict_time(
        store, monkeypatch):
    monkeypatch.setattr(hosts, "VERDICT_S", 0.2)
    lost = []
    followers = hosts.Followers()
    followers.on_lost = lost.append
    store.count("serve/beat/1")
    sequence = followers.publish("job", id="000001", settings={})
    # process 1 is still in the job's collectives: it never says it ended
    reason = followers.settle(sequence, ("failed", "error: disk full"))
    assert reason == lost[0] == ("process 1 of 2 had not ended run 1 0.2 s after it "
                                 "failed on process 0 (error: disk full): the processes "
                                 "are out of step")
    with pytest.raises(RuntimeError, match="no run can be handed on"):
        followers.publish("job", id="000002", settings={})
    followers.close()
    assert "serve/run/2" not in store.values


def test_the_others_stop_when_process_0_stops_before_serving(store):
    followers = hosts.Followers()
    followers.abort("error: outputs/x is in use by porter run")
    assert store.values["serve/abort"] == "error: outputs/x is in use by porter run"
    with pytest.raises(UsageError, match="process 0 stopped: error: outputs/x is in use"):
        hosts._see_folder(1)
    with pytest.raises(UsageError, match="process 0 stopped"):
        hosts._runs(None, 1, [], say=lambda message: None)


def test_a_process_sent_a_signal_leaves_and_one_stopped_with_the_others_goes_on(
        monkeypatch):
    from porter.errors import Interrupted
    from porter.runtime import interrupt

    def stopped(*args, **kwargs):
        raise Interrupted(15)
    monkeypatch.setattr(hosts.runners, "run_into", stopped)
    monkeypatch.setattr(hosts, "Call", lambda *args, **kwargs: None)

    class Port:
        def settings(self, source, **values):
            return type("R", (), {"serve": type("S", (), {"preview_every": None})})()
    run = {"kind": "job", "id": "000001", "settings": {}, "folder": "/nowhere"}
    monkeypatch.setattr(interrupt, "received", lambda: None)  # process 0's cancel
    assert hosts._run(Port(), run, [], say=lambda message: None) == hosts.STOPPED
    monkeypatch.setattr(interrupt, "received", lambda: 15)  # its own SIGTERM
    with pytest.raises(Interrupted):
        hosts._run(Port(), run, [], say=lambda message: None)
