"""The embedded target: default answers, fault rules, dedup, recording, control API, the process helper."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from bulkrelay.demo.target import RunningTarget, parse_plan, start_target
from tests import targetproc
from tests.targetproc import TargetProcess
from tests.waiting import wait_for
from tests.zygoteclient import Zygote

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: real processes, outside the fast lane


class _Client:
    """A tiny aiohttp client for poking the target."""

    def __init__(self, target: RunningTarget, session: aiohttp.ClientSession) -> None:
        self.target = target
        self.session = session

    async def post(
        self, path: str = "/v1/items", body: Any = None, key: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        data = json.dumps(body if body is not None else {"n": 1}).encode()
        async with self.session.post(self.target.url + path, data=data, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    async def control(self, method: str, action: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        async with self.session.request(method, f"{self.target.url}/_control/{action}", data=data) as resp:
            text = await resp.text()
            if action == "requests":
                return resp.status, [json.loads(line) for line in text.splitlines()]
            return resp.status, json.loads(text)


@asynccontextmanager
async def _target(plan: dict[str, Any] | None = None) -> AsyncIterator[_Client]:
    target = await start_target(plan)
    try:
        async with aiohttp.ClientSession() as session:
            yield _Client(target, session)
    finally:
        await target.stop()


async def test_default_answer_and_recording() -> None:
    async with _target() as client:
        status, headers, body = await client.post("/v1/items?source=test", {"email": "a@x"}, key="k-1")
        assert (status, json.loads(body)) == (200, {"id": "1"})
        assert headers["Content-Type"] == "application/json"
        status, records = await client.control("GET", "requests")
        assert status == 200
        assert len(records) == 1
        record = records[0]
        assert (record["method"], record["path"], record["query"]) == ("POST", "/v1/items", "source=test")
        assert record["raw_path"] == "/v1/items"
        assert record["headers"]["Idempotency-Key"] == "k-1"
        assert record["idempotency_key"] == "k-1"
        assert json.loads(record["body"]) == {"email": "a@x"}
        assert (record["status"], record["duplicate"]) == (200, False)
        _, stats = await client.control("GET", "stats")
        assert stats["requests"] == 1
        assert stats["by_status"] == {"200": 1}
        assert stats["effects"] == 1


async def test_recorded_path_keeps_the_encoding_as_sent() -> None:
    async with _target() as client:
        async with client.session.post(client.target.url + "/v1/a%20b%2Fc?x=%C3%A9", data=b"{}") as resp:
            assert resp.status == 200
        _, [record] = await client.control("GET", "requests")
        assert (record["path"], record["raw_path"], record["query"]) == (
            "/v1/a b/c",
            "/v1/a%20b%2Fc",
            "x=%C3%A9",
        )


async def test_body_field_rule_answers_matching_rows_only() -> None:
    plan = {
        "rules": [
            {
                "match": {"body_field": "email", "contains": "invalid"},
                "status": 422,
                "body": {"error": "bad"},
            },
            {"match": {"body_field": "age", "equals": 0}, "status": 400},
        ]
    }
    async with _target(plan) as client:
        assert (await client.post(body={"email": "an-invalid-one"}))[0] == 422
        assert (await client.post(body={"email": "ok@x"}))[0] == 200
        assert (await client.post(body={"age": 0}))[0] == 400
        assert (await client.post(body={"age": 1}))[0] == 200
        assert (await client.post(body={"other": "invalid"}))[0] == 200
        _, stats = await client.control("GET", "stats")
        assert stats["by_status"] == {"200": 3, "400": 1, "422": 1}
        assert stats["effects"] == 3


async def test_echo_header_puts_the_header_in_the_body_in_each_form() -> None:
    template = "{echo}|{echo_json}|{echo_url}|{echo_b64}"
    plan = {"rules": [{"status": 401, "echo_header": "X-Token", "body": template}, {"status": 200}]}
    async with _target(plan) as client:
        url = client.target.url + "/v1/items"
        async with client.session.post(url, data=b"{}", headers={"X-Token": 'a "b\\c d'}) as resp:
            assert resp.status == 401
            assert await resp.read() == b'a "b\\c d|a \\"b\\\\c d|a%20%22b%5Cc%20d|YSAiYlxjIGQ='
        plan["rules"] = [{"echo_header": "X-Token", "body": {"token": "{echo_json}"}}]
        await client.control("POST", "plan", plan)
        async with client.session.post(url, data=b"{}", headers={"X-Token": 'q"'}) as resp:
            assert json.loads(await resp.read()) == {"token": 'q"'}


async def test_first_attempts_fail_each_distinct_request() -> None:
    plan = {"rules": [{"first_attempts": 2, "status": 503, "retry_after": "1"}]}
    async with _target(plan) as client:
        first = [await client.post(key="a") for _ in range(3)]
        assert [s for s, _, _ in first] == [503, 503, 200]
        assert first[0][1]["Retry-After"] == "1"
        assert (await client.post(key="b"))[0] == 503  # a new key starts its own count
        keyless = [(await client.post(body={"row": 7}))[0] for _ in range(3)]
        assert keyless == [503, 503, 200]  # keyed by a hash of method, path and body


async def test_burst_and_after_limits() -> None:
    plan = {"rules": [{"times": 2, "status": 502}]}
    async with _target(plan) as client:
        assert [(await client.post())[0] for _ in range(4)] == [502, 502, 200, 200]
        status, _ = await client.control("POST", "plan", {"rules": [{"after": 2, "status": 401}]})
        assert status == 200
        assert [(await client.post())[0] for _ in range(4)] == [200, 200, 401, 401]


async def test_match_on_method_and_path() -> None:
    plan = {"rules": [{"match": {"method": "post", "path_contains": "/slow/"}, "status": 504}]}
    async with _target(plan) as client:
        assert (await client.post("/slow/1"))[0] == 504
        assert (await client.post("/fast/1"))[0] == 200
        async with client.session.get(client.target.url + "/slow/1") as resp:
            assert resp.status == 200


async def test_delay_slows_the_answer() -> None:
    async with _target({"rules": [{"delay_ms": 200}]}) as client:
        started = time.monotonic()
        status, _, _ = await client.post()
        assert status == 200
        assert time.monotonic() - started >= 0.19


async def test_release_answers_every_delayed_request_now_and_keeps_later_delays() -> None:
    """A key held by a long delay is in progress (409) until POST /_control/release lets it go; a delay
    that starts after the release runs its course."""
    plan = {"dedup": True, "in_progress_status": 409, "rules": [{"delay_ms": 600_000}]}
    async with _target(plan) as client, anyio.create_task_group() as held:
        answers: list[int] = []

        async def send(key: str) -> None:
            answers.append((await client.post(key=key))[0])

        held.start_soon(send, "a")
        held.start_soon(send, "b")
        while client.target.state.stats()["requests"] < 2:
            await anyio.sleep(0.01)
        assert (await client.post(key="a"))[0] == 409  # still being answered
        assert (await client.control("POST", "release"))[0] == 200
        with anyio.fail_after(60):
            while len(answers) < 2:
                await anyio.sleep(0.01)
        assert answers == [200, 200]
        with anyio.move_on_after(0.3) as later:
            await client.post(key="c")  # a delay that started after the release is held again
        assert later.cancelled_caught
        client.target.state.release()


async def test_reset_closes_without_answer() -> None:
    async with _target({"rules": [{"times": 1, "reset": True}]}) as client:
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.post()
        assert (await client.post())[0] == 200
        _, stats = await client.control("GET", "stats")
        assert (stats["resets"], stats["requests"], stats["by_status"]) == (1, 2, {"200": 1})
        _, records = await client.control("GET", "requests")
        assert [r["status"] for r in records] == [None, 200]


async def test_dedup_replays_the_stored_answer() -> None:
    plan = {"dedup": True, "rules": [{"first_attempts": 1, "status": 503}]}
    async with _target(plan) as client:
        assert (await client.post(key="k"))[0] == 503  # a failure is not applied, so not stored
        _, _, applied = await client.post(key="k")
        status, _, replayed = await client.post(key="k")
        assert (status, replayed) == (200, applied)
        assert (await client.post(key="other"))[0] == 503
        status, _, other = await client.post(key="other")
        assert (status, other) == (200, b'{"id":"2"}')
        _, stats = await client.control("GET", "stats")
        assert (stats["effects"], stats["duplicates"], stats["requests"]) == (2, 1, 5)
        _, records = await client.control("GET", "requests")
        assert [r["duplicate"] for r in records] == [False, False, True, False, False]


async def test_the_store_holds_what_was_applied_and_a_replayed_key_changes_nothing() -> None:
    async with _target({"dedup": True, "store": True}) as client:
        await client.post("/items/1", {"v": "A"}, key="k-A")
        await client.post("/items/1", {"v": "B"}, key="k-B")
        await client.post("/items/1", {"v": "A"}, key="k-A")  # replayed: the record stays B
        await client.post("/items/2", {"v": "C"}, key="k-C")
        async with client.session.delete(client.target.url + "/items/2") as resp:
            assert resp.status == 200
        assert (await client.control("POST", "reset"))[0] == 200  # the records outlive a reset
        assert await client.control("GET", "store") == (200, {"/items/1": {"v": "B"}})


@pytest.mark.parametrize(
    ("store_keys", "held"),
    [
        ("exact", {"/items/abc": {"v": 2}, "/items/ABC": {"v": 1}, "/items/Zo\u00eb": {"v": 3}}),
        ("nfc", {"/items/abc": {"v": 2}, "/items/ABC": {"v": 1}}),  # Zoë in either form is one record
        ("casefold", {"/items/abc": {"v": 2}}),
    ],
)
async def test_store_keys_says_which_paths_are_one_record(store_keys: str, held: dict[str, Any]) -> None:
    """A case-insensitive store keeps a record under the path last written; a DELETE in another case
    or Unicode form removes it."""
    async with _target({"store": True, "store_keys": store_keys}) as client:
        await client.post("/items/ABC", {"v": 1})
        await client.post("/items/abc", {"v": 2})
        await client.post("/items/Zo\u00eb", {"v": 3})  # composed
        async with client.session.delete(client.target.url + "/items/Zoe\u0308") as resp:  # decomposed
            assert resp.status == 200
        assert (await client.control("GET", "store"))[1] == held


async def test_without_dedup_every_success_is_an_effect() -> None:
    async with _target() as client:
        for _ in range(3):
            await client.post(key="same")
        _, stats = await client.control("GET", "stats")
        assert (stats["effects"], stats["duplicates"]) == (3, 0)


async def test_control_api_plan_reset_and_errors() -> None:
    async with _target({"status": 201}) as client:
        assert (await client.post())[0] == 201
        status, plan = await client.control("GET", "plan")
        assert (status, plan["status"], plan["rules"]) == (200, 201, [])
        status, error = await client.control("POST", "plan", {"rules": [{"stauts": 500}]})
        assert status == 400
        assert "stauts" in error["error"]
        assert (await client.post())[0] == 201  # the bad plan did not replace the good one
        assert (await client.control("POST", "reset"))[0] == 200
        _, stats = await client.control("GET", "stats")
        assert (stats["requests"], stats["effects"]) == (0, 0)  # control calls are never counted
        assert (await client.control("GET", "requests"))[1] == []
        assert (await client.control("GET", "nothing"))[0] == 404


async def test_recording_can_be_switched_off() -> None:
    async with _target({"record": False}) as client:
        await client.post()
        assert (await client.control("GET", "requests"))[1] == []
        assert (await client.control("GET", "stats"))[1]["requests"] == 1


async def test_arrival_rate_observation() -> None:
    async with _target() as client:
        for _ in range(5):
            await client.post()
        _, stats = await client.control("GET", "stats")
        assert stats["arrivals_per_second"] == [5]
        assert stats["max_arrivals_in_any_second"] == 5
        times = client.target.state.arrival_times()
        assert len(times) == 5
        assert times == sorted(times)


def test_plan_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValueError, match="unknown"):
        parse_plan({"unknown": 1})
    with pytest.raises(ValueError, match="status"):
        parse_plan({"rules": [{"status": 99}]})
    assert parse_plan(None).status == 200


@pytest.mark.parametrize("zygote", [True, False], ids=["forked-by-the-zygote", "started-as-a-process"])
def test_target_process_helper(zygote: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not zygote:  # the helper's fallback when no zygote answers
        broken = Zygote("target")
        broken._broken = True
        monkeypatch.setattr(targetproc, "_zygote", broken)
    with TargetProcess({"rules": [{"times": 1, "status": 503}]}) as target:
        request = urllib.request.Request(target.url + "/x", data=b'{"a":1}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(request, timeout=5)
        assert failed.value.code == 503
        failed.value.close()
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
        target.set_plan({"status": 202})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 202
        assert target.stats()["by_status"] == {"200": 1, "202": 1, "503": 1}
        assert [r["body"] for r in target.requests()] == ['{"a":1}'] * 3
        target.reset()
        assert target.stats()["requests"] == 0
        pid = target.pid
        assert pid is not None and pid != os.getpid()
        os.kill(pid, 0)  # running
    with pytest.raises(ProcessLookupError):  # stopped on exit, and reaped
        os.kill(pid, 0)


def test_a_target_that_cannot_start_is_reported_with_its_log() -> None:
    """A forked target that ends before it serves is seen ending, and its error is in the message."""
    with pytest.raises(RuntimeError, match=r"(?s)exited with 1.*status"):
        TargetProcess({"rules": [{"status": 99}]}).start()


def _ended(pid: int) -> bool:
    """The process is gone, or a zombie no one has reaped yet: it runs no more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_target_whose_zygote_is_gone_still_ends_with_its_test(monkeypatch: pytest.MonkeyPatch) -> None:
    zygote = Zygote("target")
    monkeypatch.setattr(targetproc, "_zygote", zygote)
    with TargetProcess() as target:
        pid = target.pid
        assert pid is not None and zygote._proc is not None
        zygote._proc.kill()  # the target is init's child now: no one will answer for it
        zygote._proc.wait()
        assert not _ended(pid)
    wait_for(lambda: _ended(pid) or None, "the target to end")
    zygote.close()
