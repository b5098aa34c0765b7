"""Which object store an fsspec file system talks to, and whether it is there: the options that
select the store (`store_id`: two stores behind one bucket name never share a cache folder), a
TCP probe of its endpoint before the first request (`probe`: the clients would retry a refused
connection for a minute and then report something else), and whether a bucket exists
(`missing_bucket`, `check_bucket`). `Store` is a base of io/fs.py's `FsspecFS`.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.parse
import urllib.request

from ..errors import ConfigError, NoBucket, RemoteError

# an endpoint that accepts no TCP connection within this many seconds (all tries together) is
# reported as unreachable before any request: the clients' own retries would take a minute
PROBE_SECONDS = 5.0

# storage options that choose which store a URL means (not how it is reached or who asks):
# two stores behind one bucket name must never share a cache folder
STORE_KEYS = ("endpoint_url", "endpoint", "host", "port", "account_name", "account_url", "project", "base_url")


class Store:
    """What FsspecFS knows of its store; uses its `fs` (the fsspec file system), `protocol` and
    `url`."""

    def _store_options(self) -> dict:
        """The options that select the store (endpoint, host, account …, from the options
        given, fsspec's configuration, or AWS_ENDPOINT_URL[_S3] for s3), as strings."""
        opts = dict(getattr(self.fs, "storage_options", {}) or {})
        nested = opts.get("client_kwargs") if isinstance(opts.get("client_kwargs"), dict) else {}
        chosen = {k: str(opts.get(k, nested.get(k))) for k in STORE_KEYS if opts.get(k, nested.get(k)) is not None}
        if self.protocol in ("s3", "s3a") and "endpoint_url" not in chosen:
            env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if env:
                chosen["endpoint_url"] = env
        return chosen

    def store_id(self) -> str:
        """The protocol and the options that select the store (`_store_options`)."""
        return self.protocol + ":" + json.dumps(self._store_options(), sort_keys=True)

    def probe(self) -> None:
        """RemoteError naming the endpoint when the store's endpoint URL (set in the options, in
        fsspec's configuration or by AWS_ENDPOINT_URL) accepts no TCP connection: a closed port,
        a name that does not resolve, no answer within PROBE_SECONDS. Called before the first
        request: the clients retry a refused connection for a minute and then report it as
        something else (s3fs's `exists` says False, "no such bucket"). Stores without an
        endpoint URL, or reached through a proxy, are not probed; a probe that succeeded is not
        repeated."""
        if getattr(self, "_probed", False):
            return
        endpoint = self._store_options().get("endpoint_url")
        u = urllib.parse.urlsplit(endpoint or "")
        try:
            host, port = u.hostname, u.port or {"http": 80, "https": 443}.get(u.scheme)
        except ValueError:  # a port that is not a number: the client names it
            return
        if not host or not port or _proxied(u.scheme, host):
            self._probed = True
            return
        deadline, last, k = time.monotonic() + PROBE_SECONDS, None, 0
        while True:
            try:
                socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())).close()
                self._probed = True
                return
            except OSError as e:
                last = e
            pause = 0.1 * 2 ** k
            if isinstance(last, (socket.timeout, socket.gaierror)) or k >= 3 or time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)  # a refused connection, tried again for a server that is just starting
            k += 1
        if isinstance(last, socket.timeout):
            why = f"no answer within {PROBE_SECONDS:g} s"
        elif isinstance(last, socket.gaierror):
            why = f"the host name {host!r} does not resolve: {last.strerror or last}"
        elif isinstance(last, ConnectionRefusedError):
            why = f"connection refused on port {port}: nothing listens there"
        else:
            why = f"{type(last).__name__}: {last}"
        raise RemoteError(f"{endpoint}: the object store's endpoint cannot be reached ({why}); is the server "
                          "running, and is endpoint_url (storage_options, fsspec's configuration or "
                          "AWS_ENDPOINT_URL) right?")

    def missing_bucket(self, path: str, attempts: int = 3, backoff: float = 0.5,
                       denied_is_missing: bool = True) -> str | None:
        """The URL of the bucket (container) at the start of `path` when the store says it does
        not exist, else None (also for stores without buckets). The endpoint is probed first
        (`probe`). On s3 one HeadBucket answers: 404 is "missing", an error that is neither 404
        nor 403 is asked again `attempts` times, `backoff`·2^k seconds apart, and then raised
        as RemoteError — a failed probe is reported as what it is. 403 (a bucket these
        credentials may not see, or may read objects of without listing it) counts as missing
        when `denied_is_missing`, else as there. Other stores answer "no" to
        any failed probe (`exists`), so there "no" is asked `attempts` times before it is
        believed."""
        if self.protocol in ("memory", "file", "local"):
            return None
        bucket = path.lstrip("/").split("/", 1)[0]
        if not bucket:
            return None
        self.probe()
        head = getattr(self.fs, "call_s3", None) if self.protocol in ("s3", "s3a") else None
        last = None
        for k in range(max(1, attempts)):
            if k:
                time.sleep(backoff * 2 ** (k - 1))
            if head is None:
                if self.fs.exists(bucket):
                    return None
                continue
            asked = k + 1
            try:
                head("head_bucket", Bucket=bucket)
                return None
            except FileNotFoundError:
                return self.url(bucket)
            except PermissionError:
                return self.url(bucket) if denied_is_missing else None
            except TypeError as e:  # an option the client takes only when it connects: fails every time
                raise ConfigError(f"{self.url(bucket)}: the storage client refused its configuration ({e}): check "
                                  "storage_options (and fsspec's configuration for this protocol)") from e
            except Exception as e:  # noqa: BLE001 — a 5xx, a timeout, a cut connection: ask again
                last = e
                if type(e).__name__ == "EndpointConnectionError" or isinstance(e, (ConnectionRefusedError,
                                                                                     socket.gaierror)):
                    break  # no connection at all, after the client's own retries: asking again tells nothing
        if head is None:
            return self.url(bucket)
        raise RemoteError(f"{self.url(bucket)}: could not find out whether the bucket exists (asked {asked} "
                          f"time{'s' if asked > 1 else ''}); last error: {type(last).__name__}: {last}") from last

    def check_bucket(self, path: str, attempts: int = 3, backoff: float = 0.5) -> None:
        """NoBucket when the bucket at the start of `path` does not exist (`missing_bucket`);
        for writing, where writing under a missing one fails late."""
        url = self.missing_bucket(path, attempts, backoff)
        if url is not None:
            bucket = url.split("://", 1)[1]
            raise NoBucket(f"{url}: no such bucket (or not one these credentials may see); create it "
                           f"first (for example `aws s3 mb {url}`, or s3fs.S3FileSystem(...).mkdir({bucket!r}))")


def _proxied(scheme: str, host: str) -> bool:
    """Whether the environment sends requests for this host through a proxy (then the client
    connects to the proxy, not to the host, and a direct probe would tell nothing)."""
    proxies = urllib.request.getproxies()
    return bool(proxies.get(scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(host)
