"""Sending one notification to one target: e-mail through Django's mail, chat services through
Apprise, and Ringmaster's own webhook (a JSON POST signed with HMAC-SHA256 of its body).

send() raises Unsent for trouble that may pass (a refused connection, a 5xx, a name that does
not resolve now: the delivery task retries it) and Undeliverable for what will not (a refused
destination, a 4xx, a redirect). Their messages go into the target's delivery log, which its owner
reads: they name no secret (no URL path, no token), and of a redirect only that it was refused.

Webhooks and Apprise's HTTP services alike connect only to the address their host was checked at
(destinations.checked, once a connection: a name that resolves elsewhere a moment later is not
followed), and follow no redirect. Apprise's plugins call requests' module functions, which make a
Session each; within pinned_requests() (a context variable, which Apprise's worker threads copy;
no other thread sees it) requests.Session.get_adapter answers with PinnedAdapter, and elsewhere
as it always does.
Apprise plugins that reach their server by a protocol of their own (MQTT, XMPP, IRC, syslog, ...)
cannot be held to a checked address: they are refused.
"""
import contextvars
import hashlib
import hmac
import json
import smtplib
from contextlib import contextmanager
from urllib.parse import urlsplit

import certifi
import requests
import urllib3
from django.core.mail import send_mail
from requests.adapters import HTTPAdapter

from jobs.domain import destinations

SIGNATURE_HEADER = "X-Ringmaster-Signature"
# Apprise plugins that notify on the machine that sends (its desktop, syslog, a USB light), and
# its e-mail plugin (whose SMTP server a URL can name): e-mail goes through the portal's own mail.
LOCAL_PLUGINS = {"blink1", "dbus", "glib", "gnome", "macosx", "syslog", "windows", "email"}
# Apprise plugins that do not speak HTTP through requests: their connections cannot be pinned.
UNPINNED_PLUGINS = {"amqp", "aprs", "deltachat", "growl", "irc", "mqtt", "nostr", "rsyslog", "smpp", "xmpp"}
TIMEOUT = urllib3.Timeout(connect=5, read=10)
REFUSED_REDIRECT = "refused: redirect"


class Unsent(Exception):
    """Not delivered this time; a later attempt may be."""


class Undeliverable(Exception):
    """Not delivered, and no later attempt would be."""


def signature(secret, body):
    """The value of the X-Ringmaster-Signature header of a webhook's `body` (bytes)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_body(payload):
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def send(target, event, payload, delivery_id):
    kind = target.kind
    if kind == "email":
        _email(target.address(), payload)
    elif kind == "apprise":
        _apprise(target.address(), payload)
    elif kind == "webhook":
        _webhook(target.address(), target.secret(), event, payload, delivery_id)
    else:
        raise Undeliverable(f"unknown kind of target {kind!r}")


def _email(address, payload):
    try:
        subject = " ".join(payload["title"].split())          # one line, whatever a job's name holds
        send_mail(subject, payload["text"], None, [address], fail_silently=False)
    except smtplib.SMTPRecipientsRefused:
        raise Undeliverable("the mail server refused the address") from None
    except (smtplib.SMTPException, OSError) as exc:
        raise Unsent(f"the mail server could not be reached or refused the message ({type(exc).__name__})") from None


# --- Apprise ----------------------------------------------------------------------------------

def apprise_plugin(url):
    """The Apprise plugin that `url` names, or Undeliverable saying why it names none we use."""
    import apprise

    plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    if plugin is None:
        raise Undeliverable("Apprise knows no service by this URL (see Apprise's list of URLs, e.g. "
                            "slack://..., msteams://..., discord://..., ntfy://...)")
    module = type(plugin).__module__.split(".")
    if any(part in LOCAL_PLUGINS for part in module[2:]):
        raise Undeliverable(f"{plugin.service_name} notifications are not sent from the portal "
                            "(for e-mail, add an e-mail target)")
    if any(part in UNPINNED_PLUGINS for part in module[2:]):
        raise Undeliverable(f"{plugin.service_name} notifications are not sent from the portal: its protocol "
                            "cannot be held to the address the portal checked (use a service reached over HTTP)")
    plugin.redirects = False                    # a URL's ?redirect=yes included
    return plugin


def apprise_hosts(plugin):
    """The host an Apprise plugin connects to where its URL names one (json://host/..., a
    self-hosted ntfy or Mattermost); plugins of one service (Slack, Discord) name none."""
    if not any("{host}" in template for template in getattr(plugin, "templates", ())):
        return []
    host = (getattr(plugin, "host", "") or "").strip("[]")
    return [host] if host else []


def shown_apprise_url(plugin):
    """The plugin's URL with its tokens and passwords masked, without its options."""
    return plugin.url(privacy=True).split("?")[0][:300]


def _apprise(url, payload):
    import logging

    import apprise

    plugin = apprise_plugin(url)
    notifier = apprise.Apprise()
    notifier.add(plugin)
    with pinned_requests() as outcome, apprise.LogCapture(level=logging.WARNING) as logs:
        delivered = notifier.notify(title=payload["title"], body=payload["text"])
        said = logs.getvalue()
    if outcome.redirected:
        raise Undeliverable(REFUSED_REDIRECT)
    if isinstance(outcome.refused, destinations.Unresolved):
        raise Unsent(str(outcome.refused))
    if outcome.refused:
        raise Undeliverable(str(outcome.refused))
    if not delivered:
        lines = [line.split(" - ", 2)[-1] for line in said.splitlines() if line.strip()]
        raise Unsent(f"{plugin.service_name}: {'; '.join(lines[-2:]) or 'not delivered'}"[:480])


class _Outcome:
    """What the pinned connections of one delivery met: a refused destination, a redirect. The
    networks it checks against are read when it is made: Apprise may send from a thread of its own."""

    def __init__(self):
        self.refused, self.redirected = None, False
        self.allowed, self.own = destinations.allowed_networks(), destinations.own_addresses()
        self.adapter = PinnedAdapter(self)


class RedirectRefused(requests.exceptions.RequestException):
    """A 3xx answer: not followed."""


class DestinationRefused(requests.exceptions.ConnectionError):
    """A host that resolves to where notifications may not go: not connected to."""


class PinnedAdapter(HTTPAdapter):
    """requests' adapter whose every connection goes to the address its host was checked at
    (pinned_pool, as a webhook's), with no proxy, and which ends a request that answers 3xx."""

    def __init__(self, outcome):
        super().__init__(max_retries=0)
        self.outcome, self.pools = outcome, []

    def get_connection_with_tls_context(self, request, verify, proxies=None, cert=None):
        parts = urlsplit(request.url)
        scheme, host = parts.scheme, parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        try:
            address = destinations.checked(host, port, self.outcome.allowed, self.outcome.own)[0]
        except destinations.Refused as exc:
            self.outcome.refused = exc
            raise DestinationRefused(str(exc), request=request) from None
        pool = pinned_pool(scheme, host, port, address)
        self.pools.append(pool)
        return pool

    def add_headers(self, request, **kwargs):
        parts = urlsplit(request.url)
        request.headers["Host"] = host_header(parts.scheme, parts.hostname or "", parts.port)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        response = super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=None)
        if 300 <= response.status_code < 400:
            self.outcome.redirected = True
            response.close()
            raise RedirectRefused(REFUSED_REDIRECT, request=request)
        return response

    def close(self):
        super().close()
        for pool in self.pools:
            pool.close()
        self.pools.clear()


_pinning = contextvars.ContextVar("ringmaster_pinned_requests", default=None)
_usual_get_adapter = getattr(requests.Session.get_adapter, "usual", requests.Session.get_adapter)


def _get_adapter(session, url):
    outcome = _pinning.get()
    if outcome is None:
        return _usual_get_adapter(session, url)
    if not url.lower().startswith(("http://", "https://")):
        raise requests.exceptions.InvalidSchema(f"only http and https are sent to, not {url.split(':')[0]}")
    return outcome.adapter


_get_adapter.usual = _usual_get_adapter
requests.Session.get_adapter = _get_adapter


@contextmanager
def pinned_requests():
    """Within: every request made through requests in this context goes through PinnedAdapter.
    Yields the outcome (.refused: the Refused of a destination; .redirected)."""
    outcome = _Outcome()
    token = _pinning.set(outcome)
    try:
        yield outcome
    finally:
        _pinning.reset(token)
        outcome.adapter.close()


# --- webhook ----------------------------------------------------------------------------------

def webhook_parts(url):
    """(scheme, host, port, path with query) of a webhook URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("Give an http:// or https:// URL.")
    if parts.username or parts.password:
        raise ValueError("Put no user or password in the URL: the secret signs each request.")
    port = parts.port or (443 if parts.scheme == "https" else 80)   # ValueError for a bad port
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


def shown_webhook_url(url):
    scheme, host, port, path = webhook_parts(url)
    default = port == (443 if scheme == "https" else 80)
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}{'' if default else f':{port}'}/{'…' if path != '/' else ''}"


def host_header(scheme, host, port):
    """The Host header of a request to `host` (a name or an address) on `port` (None: the default)."""
    default = port in (None, 443 if scheme == "https" else 80)
    return (f"[{host}]" if ":" in host else host) + ("" if default else f":{port}")


def pinned_pool(scheme, host, port, address):
    """A urllib3 pool of connections to `address` (where `host` was checked to resolve), TLS
    checked against `host`'s name, no retries; a redirect is the caller's to refuse."""
    if scheme == "https":
        return urllib3.HTTPSConnectionPool(str(address), port, timeout=TIMEOUT, retries=False, maxsize=1,
                                           server_hostname=host, assert_hostname=host, cert_reqs="CERT_REQUIRED",
                                           ca_certs=certifi.where())
    return urllib3.HTTPConnectionPool(str(address), port, timeout=TIMEOUT, retries=False, maxsize=1)


def _webhook(url, secret, event, payload, delivery_id):
    """POST the payload to the address the URL's host was checked at (so a name that resolves
    elsewhere a moment later is not followed), redirects not followed."""
    try:
        scheme, host, port, path = webhook_parts(url)
        address = destinations.checked(host, port)[0]
    except ValueError as exc:
        raise Undeliverable(str(exc)) from None
    except destinations.Unresolved as exc:
        raise Unsent(str(exc)) from None
    except destinations.Refused as exc:
        raise Undeliverable(str(exc)) from None
    body = webhook_body(payload)
    headers = {
        "Host": host_header(scheme, host, port),
        "Content-Type": "application/json",
        "User-Agent": "Ringmaster",
        "X-Ringmaster-Event": event,
        "X-Ringmaster-Delivery": str(delivery_id),
        SIGNATURE_HEADER: signature(secret, body),
    }
    pool = pinned_pool(scheme, host, port, address)
    try:
        with pool:
            response = pool.urlopen("POST", path, body=body, headers=headers, redirect=False, retries=False,
                                    assert_same_host=False, preload_content=False)
            status = response.status
            response.drain_conn()
    except urllib3.exceptions.HTTPError as exc:
        raise Unsent(f"{host}:{port} did not answer ({type(exc).__name__})") from None
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise Undeliverable(REFUSED_REDIRECT)
    if status in (408, 425, 429) or status >= 500:
        raise Unsent(f"{host} answered HTTP {status}")
    raise Undeliverable(f"{host} answered HTTP {status}")

