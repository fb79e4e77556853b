"""Who may change a queue through the dashboard, and from where.

Pages, event streams, ``/metrics`` and ``/healthz`` only read. Every action (requeue or delete
dead letters, pause, resume) is a POST that must pass, in this order:

1. actions are on: the dashboard was started with a token (``ROTATOR_DASHBOARD_TOKEN``);
2. the request is not cross-site: ``Sec-Fetch-Site``, when the browser sends it, says
   ``same-origin``, and ``Origin``, when sent, is the dashboard's own;
3. the token, in the ``X-Rotator-Token`` header or the ``token`` form field, equals the
   dashboard's (compared in constant time).

The page never holds the token: a person types it, and the page's script keeps it in the
tab's session storage. A page of another site can make a browser POST here, but without the
token (and with its own Origin) it is refused. The Host header is checked too (see
:func:`allowed_hosts`), so a DNS-rebinding page cannot read a dashboard on loopback.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from urllib.parse import parse_qs

from starlette.requests import Request

TOKEN_ENV = "ROTATOR_DASHBOARD_TOKEN"
TOKEN_HEADER = "x-rotator-token"
TOKEN_FIELD = "token"
# The largest action form read (a few ids or dead letters; a letter is at most about 5 KB).
FORM_LIMIT = 256 * 1024
# Host names a dashboard bound to loopback answers to.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
# A token shorter than this is accepted, with a warning (see the dashboard command).
SHORT_TOKEN = 16

Form = Mapping[str, list[str]]


class Refused(Exception):
    """An action that may not run: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def token_from_env(environ: Mapping[str, str]) -> str | None:
    """The token actions need, or None (actions off) when it is unset or blank."""
    token = environ.get(TOKEN_ENV, "").strip()
    return token or None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str) -> list[str]:
    """The Host header values a dashboard bound to ``bind`` answers: the loopback names when
    it listens on loopback (a page of another site rebinding its name to 127.0.0.1 gets 400),
    anything otherwise (whoever can reach the port can read the pages: actions still need the
    token)."""
    if is_loopback(bind):
        return sorted({*LOOPBACK_HOSTS, bind})
    return ["*"]


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}".lower()


def check_site(request: Request) -> None:
    """Refuses a request that a browser says comes from another site or origin. Clients that
    send neither header (curl, scripts) pass on to the token check."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        raise Refused(403, f"refused: a cross-site request (Sec-Fetch-Site: {site})")
    origin = request.headers.get("origin")
    if origin is not None and origin.lower() != own_origin(request):
        raise Refused(403, f"refused: a request from another origin ({origin})")


def check_token(given: str | None, token: str | None) -> None:
    if token is None:
        raise Refused(
            403,
            f"actions are off: start the dashboard with {TOKEN_ENV} set to allow them",
        )
    if not given:
        raise Refused(403, "refused: this action needs the dashboard token")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise Refused(403, "refused: wrong token")


def check_action(request: Request, form: Form, token: str | None) -> None:
    """Raises Refused unless the action may run (see the module's docstring)."""
    if token is None:
        check_token(None, None)
    check_site(request)
    given = request.headers.get(TOKEN_HEADER)
    if given is None:
        given = next(iter(form.get(TOKEN_FIELD, [])), None)
    check_token(given, token)


async def read_form(request: Request) -> dict[str, list[str]]:
    """The request's url-encoded form (at most FORM_LIMIT bytes), without python-multipart."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind not in ("", "application/x-www-form-urlencoded"):
        raise Refused(415, "send the action as application/x-www-form-urlencoded")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            raise Refused(413, "the form is too large")
    try:
        text = body.decode("utf-8", "surrogateescape")
        return parse_qs(text, keep_blank_values=True, errors="surrogateescape", max_num_fields=500)
    except ValueError as error:
        raise Refused(400, f"a bad form: {error}") from error
