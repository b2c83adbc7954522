"""The launcher pods' logs, streamed on one event loop for every job a process follows.

A log stream (`GET …/pods/<pod>/log?follow=true`) is one long-lived HTTP response per job. Read
by a thread each, a worker following a thousand jobs would hold a thousand threads that each wake
for every line. So one asyncio loop (a thread of the process) reads every stream with aiohttp, and
hands what arrives to the stream's owner (`on_data`, then `on_end`), called on the loop: the
owner queues it and rings its follow's bell (runners.base.Bell).

The request is the one the kubernetes client would send: the same server, TLS settings and
credentials (its Configuration's auth settings, so a refreshed token is used), and the same
query (container, follow, timestamps, sinceSeconds).
"""
import asyncio
import logging
import os
import ssl
import threading
from urllib.parse import quote

import aiohttp

log = logging.getLogger(__name__)


class LogStreamError(Exception):
    """The API server refused the log (status: its HTTP status), or was not reached (status 0)."""

    def __init__(self, status, message):
        super().__init__(f"({status}) {message}")
        self.status = status


class _Loop:
    def __init__(self):
        self._lock = threading.Lock()
        self._pid = self._loop = self._thread = None
        self._sessions = {}

    def loop(self):
        with self._lock:
            if self._pid != os.getpid() or not self._thread.is_alive():
                self._pid, self._sessions = os.getpid(), {}
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="kube-logs")
                self._thread.start()
            return self._loop

    async def session(self, configuration):
        """An aiohttp session to the API server of `configuration` while streams use it (on the
        loop's thread), given back by release(): no cap on its connections, as each stream
        holds one for as long as its pod runs."""
        key = _server(configuration)
        found = self._sessions.get(key)
        if found is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=_ssl_context(configuration))
            found = self._sessions[key] = [aiohttp.ClientSession(connector=connector), 0]
        found[1] += 1
        return key, found[0]

    async def release(self, key):
        found = self._sessions[key]
        found[1] -= 1
        if found[1] == 0:
            del self._sessions[key]
            await found[0].close()


_loop = _Loop()


def _server(configuration):
    """What a session is shared by: the server and how it is reached (not the credentials,
    which go with each request)."""
    return (configuration.host, configuration.verify_ssl, configuration.ssl_ca_cert, configuration.cert_file,
            configuration.key_file, configuration.assert_hostname)


def _ssl_context(configuration):
    if not configuration.host.startswith("https"):
        return None
    if not configuration.verify_ssl:
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if configuration.assert_hostname is False:
        context.check_hostname = False
    return context


def _headers(api_client):
    headers = {}
    api_client.update_params_for_auth(headers, [], ["BearerToken"])
    return headers


def open_stream(api_client, namespace, pod, container, since_seconds, timeouts, on_data, on_end):
    """Start streaming `pod`'s log (from `since_seconds` ago where given, with timestamps);
    `timeouts` is (connect, idle) in seconds. on_data(bytes) for what arrives, then once
    on_end(None) at its clean end or on_end(exception) where it was cut, went silent for `idle`
    seconds, was refused or could not be asked (LogStreamError). Both are called on the loop's
    thread. Returns a future whose cancel() stops the stream (on_end is not called then)."""
    configuration = api_client.configuration
    url = (f"{configuration.host}/api/v1/namespaces/{quote(namespace, safe='')}/pods/"
           f"{quote(pod, safe='')}/log")
    params = {"container": container, "follow": "true", "timestamps": "true"}
    if since_seconds:
        params["sinceSeconds"] = str(since_seconds)
    headers = _headers(api_client)
    loop = _loop.loop()

    async def stream():
        connect, idle = timeouts
        key = None
        try:
            try:
                key, session = await _loop.session(configuration)
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=idle)
                response = await session.get(url, params=params, headers=headers, timeout=timeout,
                                             proxy=configuration.proxy or None,
                                             server_hostname=configuration.tls_server_name or None)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                raise LogStreamError(0, f"cannot reach the API server: {str(exc) or type(exc).__name__}") from exc
            async with response:
                if response.status != 200:
                    raise LogStreamError(response.status, (await response.text())[:500])
                async for data in response.content.iter_any():
                    on_data(data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            on_end(exc)
        else:
            on_end(None)
        finally:
            if key is not None:
                await _loop.release(key)

    return asyncio.run_coroutine_threadsafe(stream(), loop)
