"""The loopback target's profile-import API, answering like Klaviyo's bulk profile import jobs: the
profiles go in the request that makes the job (JSON:API), and only the failed ones are listed after.

    POST .../api/profile-bulk-import-jobs      {"data": {"type": "profile-bulk-import-job", "attributes":
                                               {"profiles": {"data": [{"type": "profile", "attributes":
                                               {"email", ...}}]}}}} -> 202 {"data": {"type", "id",
                                               "attributes": {"status": "queued", "total_count"}}}: it runs
                                               now. A body of another shape, or a profile that is not
                                               {type: profile, attributes: {...}}, answers 400 (JSON:API
                                               `errors`, `source.pointer` naming the place): nothing imported
    GET  .../api/profile-bulk-import-jobs/{id}  its status at data.attributes.status: queued, processing,
                                               then complete after `polls_to_complete` polls (with
                                               completed_count and failed_count)
    GET  .../api/profile-bulk-import-jobs/{id}/import-errors[?page[cursor]=N]
                                               the failed profiles alone, `errors_page_size` a page, each
                                               {"type": "import-error", "id", "attributes": {"code", "title",
                                               "detail", "source": {"pointer"}, "original_payload": the
                                               profile's attributes as sent}}; `links.next` the next page's
                                               absolute URL, null on the last

The plan's `profile_imports` object sets the options: a profile whose email holds `fail_contains` fails,
and so does one without an email, phone_number or external_id (a profile is upserted by them). Stats count
jobs made and completed, profiles imported, and `profiles_in_two_jobs`: emails imported by more than one
job (a relay that submitted twice).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

_JOBS = "/api/profile-bulk-import-jobs"
_JSON_API = "application/vnd.api+json"
_Answer = tuple[int, bytes, str]
_IDENTIFIERS = ("email", "phone_number", "external_id")  # a profile is upserted by one of them


class ProfileImportOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fail_contains: str = "bogus"
    polls_to_complete: int = Field(default=2, ge=1)
    errors_page_size: int = Field(default=2, ge=1)


@dataclass(slots=True)
class _Job:
    id: str
    total: int
    errors: list[dict[str, Any]] = field(default_factory=list)
    status: str = "queued"
    polls: int = 0


class ProfileImports:
    """Profile import jobs: made with their profiles, polled, their failed profiles listed in pages."""

    def __init__(self, options: ProfileImportOptions) -> None:
        self.options = options
        self._jobs: dict[str, _Job] = {}
        self.imported: Counter[str] = Counter()  # emails imported, by jobs that ran
        self.completed = 0

    @staticmethod
    def handles(path: str) -> bool:
        return _JOBS in path

    def stats(self) -> dict[str, Any]:
        return {
            "profile_imports": {"created": len(self._jobs), "complete": self.completed},
            "profiles_imported": sum(self.imported.values()),
            "profiles_in_two_jobs": sum(1 for times in self.imported.values() if times > 1),
        }

    def answer(self, method: str, path: str, query: str, body: bytes, origin: str) -> _Answer:
        """(status, body, content type) for a request to the profile-import API; `origin` is this
        target's scheme://host:port, for the next page's absolute URL."""
        tail = path[path.index(_JOBS) + len(_JOBS) :].strip("/")
        if not tail:
            return self._create(body) if method == "POST" else _error(405, "POST to make an import job", "")
        job_id, _, step = tail.partition("/")
        found = self._jobs.get(job_id)
        if found is None or method != "GET":
            return _error(404, f"no {method} {path}", "")
        if not step:
            return self._poll(found)
        if step == "import-errors":
            return self._errors_page(found, query, f"{origin}{_JOBS}/{found.id}/import-errors")
        return _error(404, f"no {method} {path}", "")

    def _create(self, body: bytes) -> _Answer:
        try:
            document = orjson.loads(body or b"null")
        except orjson.JSONDecodeError:
            return _error(400, "the body is not JSON", "")
        profiles, refused = _profiles(document)
        if refused is not None:
            return _error(400, *refused)
        found = _Job(f"kl{len(self._jobs) + 1:06d}", len(profiles))
        self._jobs[found.id] = found
        for number, profile in enumerate(profiles):
            attributes = profile["attributes"]
            why = self._refusal(attributes)
            if why is None:
                self.imported[str(attributes.get("email"))] += 1
            else:
                found.errors.append(_import_error(f"{found.id}-{number}", number, why, attributes))
        attributes = {"status": found.status, "total_count": found.total}
        answer = {"type": "profile-bulk-import-job", "id": found.id, "attributes": attributes}
        return 202, orjson.dumps({"data": answer}), _JSON_API

    def _refusal(self, attributes: dict[str, Any]) -> str | None:
        email = attributes.get("email")
        if not any(isinstance(attributes.get(name), str) for name in _IDENTIFIERS):
            return "a profile needs an email, phone_number or external_id"
        if isinstance(email, str) and self.options.fail_contains in email:
            return f"{email} is not a valid email address"
        return None

    def _poll(self, found: _Job) -> _Answer:
        if found.status != "complete":
            found.polls += 1
            found.status = "processing"
            if found.polls >= self.options.polls_to_complete:
                found.status = "complete"
                self.completed += 1
        attributes: dict[str, Any] = {"status": found.status, "total_count": found.total}
        if found.status == "complete":
            failed = len(found.errors)
            attributes |= {"completed_count": found.total - failed, "failed_count": failed}
        data = {"type": "profile-bulk-import-job", "id": found.id, "attributes": attributes}
        return 200, orjson.dumps({"data": data}), _JSON_API

    def _errors_page(self, found: _Job, query: str, url: str) -> _Answer:
        cursor = _cursor(query)
        size = self.options.errors_page_size
        page = found.errors[cursor : cursor + size]
        after = cursor + size
        links = {"self": f"{url}?page[cursor]={cursor}", "next": None}
        if after < len(found.errors):
            links["next"] = f"{url}?page[cursor]={after}"
        return 200, orjson.dumps({"data": page, "links": links}), _JSON_API


def _profiles(document: Any) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """The body's profiles, or why it is refused (the message and the JSON:API pointer to the place)."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, dict) or data.get("type") != "profile-bulk-import-job":
        return [], ("the body is no profile-bulk-import-job", "/data/type")
    attributes = data.get("attributes")
    profiles = attributes.get("profiles") if isinstance(attributes, dict) else None
    listed = profiles.get("data") if isinstance(profiles, dict) else None
    if not isinstance(listed, list) or not listed:
        return [], ("no profiles at data.attributes.profiles.data", "/data/attributes/profiles/data")
    for number, profile in enumerate(listed):
        if (
            not isinstance(profile, dict)
            or profile.get("type") != "profile"
            or not isinstance(profile.get("attributes"), dict)
        ):
            where = f"/data/attributes/profiles/data/{number}"
            return [], (f"profile {number} is not {{type: profile, attributes: {{...}}}}", where)
    return listed, None


def _import_error(error_id: str, number: int, why: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """A failed profile, as the import-errors list gives it: its original payload, the attributes sent."""
    pointer = f"/data/attributes/profiles/data/{number}/attributes"
    error = {"code": "invalid", "title": "Invalid input.", "detail": why, "source": {"pointer": pointer}}
    return {"type": "import-error", "id": error_id, "attributes": error | {"original_payload": attributes}}


def _cursor(query: str) -> int:
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name in ("page[cursor]", "page%5Bcursor%5D") and value.isdigit():
            return int(value)
    return 0


def _error(status: int, detail: str, pointer: str) -> _Answer:
    error: dict[str, Any] = {"status": status, "code": "invalid", "title": "Invalid input.", "detail": detail}
    if pointer:
        error["source"] = {"pointer": pointer}
    return status, orjson.dumps({"errors": [error]}), _JSON_API
