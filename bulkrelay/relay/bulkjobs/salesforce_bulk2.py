"""`kind: salesforce_bulk2`: the steps of a Salesforce Bulk API 2.0 ingest job, over the transport seam.

    POST  {base_url}/jobs/ingest                       create: {object, operation, externalIdFieldName,
                                                       contentType: CSV, lineEnding} -> {id, state: Open}
    PUT   {base_url}/jobs/ingest/{id}/batches          the job's CSV, in one request (text/csv)
    PATCH {base_url}/jobs/ingest/{id}                  {"state": "UploadComplete"} closes it; "Aborted" aborts
    GET   {base_url}/jobs/ingest/{id}                  its state: Open, UploadComplete, InProgress,
                                                       JobComplete, Failed, Aborted (errorMessage)
    GET   {base_url}/jobs/ingest/{id}/successfulResults    CSV: sf__Id, sf__Created, then the job's columns
    GET   {base_url}/jobs/ingest/{id}/failedResults        CSV: sf__Id, sf__Error, then the job's columns
    GET   {base_url}/jobs/ingest/{id}/unprocessedrecords   CSV: the job's columns

Every step but the upload is asked again as steps.py says. An upload is never sent twice to a job: one
that fails is answered by aborting the job (relay/bulkjobs/jobs.py). The job's id goes in each URL as one
path segment (steps.segment); a poll or a result file that cannot be read is asked again (steps.readable).
"""

from __future__ import annotations

from typing import Any

import orjson

from bulkrelay.relay.bulkjobs.steps import (
    ABORTED,
    OPEN,
    UPLOAD_COMPLETE,
    AnswerUnreadable,
    JobResults,
    StepClient,
    StepRefused,
    csv_rows,
    job_id,
    json_answer,
    never_sent,
    segment,
)


class SalesforceBulk2(StepClient):
    """The ingest API of one job file: its base URL, headers (auth included) and CSV columns."""

    @property
    def _jobs(self) -> str:
        return f"{self._base}/jobs/ingest"

    async def create(self, number: int, keys: list[str]) -> str:
        config = self._config
        spec: dict[str, Any] = {"object": config.object, "operation": config.operation, "contentType": "CSV"}
        if config.external_id_field is not None:
            spec["externalIdFieldName"] = config.external_id_field
        spec["lineEnding"] = config.line_ending
        answer = await self._asked("create", "POST", self._jobs, orjson.dumps(spec), "application/json")
        return job_id(json_answer(answer, "create").get("id"), "create", answer.status)

    def _job(self, remote: str) -> str:
        return f"{self._jobs}/{segment(remote)}"

    async def upload(self, remote: str, body: bytes) -> None:
        """The job's CSV, once: a transport error or any answer but 2xx is StepRefused (abort the job)."""
        await self._sent_once(
            "upload", self._request("PUT", f"{self._job(remote)}/batches", body, "text/csv")
        )

    async def close(self, remote: str) -> None:
        """Close the job; a refusal after an earlier try whose answer was lost is no refusal when the
        job is closed already."""
        try:
            await self._set_state(remote, UPLOAD_COMPLETE)
        except StepRefused:
            if (await self.state(remote))[0] == OPEN:
                raise

    async def abort(self, remote: str) -> None:
        await self._set_state(remote, ABORTED)

    async def state(self, remote: str) -> tuple[str, str | None]:
        """The job's state and, for a failed one, its errorMessage; asked until an answer can be read."""
        return await self.readable(lambda: self._state(remote))

    async def _state(self, remote: str) -> tuple[str, str | None]:
        answer = await self._asked("poll", "GET", self._job(remote), None, None, poll=True)
        data = json_answer(answer, "poll")
        state = data.get("state")
        if not isinstance(state, str):
            raise AnswerUnreadable("poll", answer.status, "the answer has no state")
        message = data.get("errorMessage")
        return state, message if isinstance(message, str) and message else None

    async def results(self, remote: str, sent: set[str]) -> JobResults:
        """The three result sets, matched by the key column, asked again while one cannot be read (a
        truncated CSV); StepRefused for a key never sent."""
        return await self.readable(lambda: self._results(remote, sent))

    async def _results(self, remote: str, sent: set[str]) -> JobResults:
        results = JobResults()
        key = self._bulk.key_column
        for row in await self._result_rows(remote, "successfulResults", key, sent):
            results.succeeded[row[key]] = {"sf__Id": row.get("sf__Id"), "sf__Created": row.get("sf__Created")}
        for row in await self._result_rows(remote, "failedResults", key, sent):
            results.failed[row[key]] = row.get("sf__Error") or "failed without an sf__Error"
        for row in await self._result_rows(remote, "unprocessedrecords", key, sent):
            results.unprocessed.add(row[key])
        return results

    async def _result_rows(self, remote: str, name: str, key: str, sent: set[str]) -> list[dict[str, str]]:
        answer = await self._asked(name, "GET", f"{self._job(remote)}/{name}", None, None, patient=True)
        rows = csv_rows(answer.body, name, key)
        for row in rows:
            if row[key] not in sent:
                raise never_sent(name, row[key], remote)
        return rows

    async def _set_state(self, remote: str, state: str) -> None:
        body = orjson.dumps({"state": state})
        await self._asked(f"state {state}", "PATCH", self._job(remote), body, "application/json")
