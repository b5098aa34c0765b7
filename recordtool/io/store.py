"""Which object store an fsspec file system talks to, and whether it is there: the options that
select the store (`store_id`: two stores behind one bucket name never share a cache folder), a
TCP probe of its endpoint before the first request (`probe`: the clients would retry a refused
connection for a minute and then report something else), and whether a bucket exists
(`missing_bucket`, `check_bucket`). `Store` is a base of io/fs.py's `FsspecFS`.

Every request to an async store (s3fs, gcsfs, adlfs, http) runs within a deadline (`call`,
`run`): the client's own timeouts bound each socket read, not a request — a server that
accepts and never answers costs its read timeout times the client's and its library's
retries (half an hour with s3fs's defaults), one that sends a byte a second never times out.
After `deadline` seconds the request is cancelled and raises TimeoutError, which `Retry`
retries like any timeout.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.parse
import urllib.request

from ..errors import AccessDenied, ConfigError, NoBucket, RemoteError

# seconds one request to an async store may take in all (connecting, the answer, one piece of
# a streamed download): RemoteOptions.deadline's default
DEADLINE = 60.0

# an endpoint that accepts no TCP connection within this many seconds (all tries together) is
# reported as unreachable before any request: the clients' own retries would take a minute
PROBE_SECONDS = 5.0

# storage options that choose which store a URL means (not how it is reached or who asks):
# two stores behind one bucket name must never share a cache folder
STORE_KEYS = ("endpoint_url", "endpoint", "host", "port", "account_name", "account_url", "project", "base_url")


# a client's errors for credentials it has none of, or cannot get (botocore, google-auth)
_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                   "DefaultCredentialsError", "RefreshError")


def refusal(e: BaseException, what: str):
    """The error to raise at once, naming `what`, for a failure that asking again would only
    repeat; None for one worth retrying. Credentials missing or refused (a 403, an invalid or
    expired key, anonymous access to a private bucket) are AccessDenied; a configuration or
    request the client refuses before sending anything is a ConfigError: a TypeError (an
    option it takes only when it connects) or botocore's ParamValidationError (a bucket name
    it cannot send)."""
    name = type(e).__name__
    if name in _NO_CREDENTIALS:
        return AccessDenied(f"{what}: no credentials to sign the request with ({e}); give them (storage_options "
                            "key and secret, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, "
                            "AWS_PROFILE), or anon=True for a public bucket")
    if isinstance(e, PermissionError):
        return AccessDenied(f"{what}: access denied by the store ({e}); check the credentials (storage_options "
                            "key and secret, the AWS_* variables, ~/.aws/credentials): anon=True reaches public "
                            "buckets only")
    if isinstance(e, TypeError):
        return ConfigError(f"{what}: the storage client refused its configuration ({e}): check "
                           "storage_options (and fsspec's configuration for this protocol)")
    if name == "ParamValidationError":
        return ConfigError(f"{what}: the storage client refuses to send this request ({e}); check the URL (an "
                           "s3 bucket name has 3 to 63 characters)")
    return None


def run(fs, deadline: float, fn, *args, **kwargs):
    """`await fn(*args, **kwargs)` on the async file system `fs`'s event loop, cancelled after
    `deadline` seconds: TimeoutError then, saying so (a timeout of the client's own, earlier,
    is raised as the client raised it)."""
    from fsspec.asyn import sync
    from fsspec.exceptions import FSTimeoutError

    start = time.monotonic()
    try:
        return sync(fs.loop, fn, *args, timeout=deadline, **kwargs)
    except FSTimeoutError as e:
        if e.__cause__ is not None and time.monotonic() - start < deadline:
            raise e.__cause__ from None
        raise TimeoutError(f"timed out: no complete answer within {deadline:g} s (the deadline of one "
                           "request, RemoteOptions.deadline)") from None


class Store:
    """What FsspecFS knows of its store; uses its `fs` (the fsspec file system), `protocol`,
    `deadline` and `url`."""

    def call(self, name: str, *args, **kwargs):
        """`self.fs.<name>(...)`, within the deadline on an async file system (its coroutine
        `_<name>` run by `run`); a sync one's method is called as it is (memory://, local)."""
        fs = self.fs
        if getattr(fs, "async_impl", False) and hasattr(fs, "_" + name):
            return run(fs, self.deadline, getattr(fs, "_" + name), *args, **kwargs)
        return getattr(fs, name)(*args, **kwargs)

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
        something else (s3fs's `exists` says False, "no such bucket"). An endpoint URL that is
        not one is a ConfigError naming it (`endpoint_parts`). Stores without an endpoint URL,
        or reached through a proxy, are not probed; a probe that succeeded is not repeated."""
        if getattr(self, "_probed", False):
            return
        endpoint = self._store_options().get("endpoint_url")
        if endpoint is None:
            self._probed = True
            return
        scheme, host, port = endpoint_parts(endpoint)
        if _proxied(scheme, host):
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
        head = self.protocol in ("s3", "s3a") and hasattr(self.fs, "call_s3")
        last = None
        for k in range(max(1, attempts)):
            if k:
                time.sleep(backoff * 2 ** (k - 1))
            if not head:
                if self.call("exists", bucket):
                    return None
                continue
            asked = k + 1
            try:
                self.call("call_s3", "head_bucket", Bucket=bucket)
                return None
            except FileNotFoundError:
                return self.url(bucket)
            except PermissionError:
                return self.url(bucket) if denied_is_missing else None
            except Exception as e:  # noqa: BLE001 — a 5xx, a timeout, a cut connection: ask again
                err = refusal(e, self.url(bucket))
                if err is not None:  # (no credentials, a refused option or bucket name): fails every time
                    raise err from e
                last = e
                if type(e).__name__ == "EndpointConnectionError" or isinstance(e, (ConnectionRefusedError,
                                                                                     socket.gaierror)):
                    break  # no connection at all, after the client's own retries: asking again tells nothing
        if not head:
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


def endpoint_parts(endpoint: str) -> tuple:
    """(scheme, host, port) of an endpoint URL, or ConfigError naming it: a scheme other than
    http or https, no host, a port that is not one, a host name no resolver takes (a label
    over 63 bytes, a name over 253). Checked before the first request: the clients retry such
    an endpoint as if the store failed, or raise a UnicodeError from deep inside."""
    shown = endpoint if len(endpoint) <= 80 else endpoint[:60] + f"… ({len(endpoint)} characters)"
    where = (f"endpoint_url {shown!r} (from storage_options, fsspec's configuration or AWS_ENDPOINT_URL) "
             "is not an endpoint URL")
    try:
        u = urllib.parse.urlsplit(endpoint)
        scheme, host, port = u.scheme, u.hostname, u.port
    except ValueError as e:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is not a number
        raise ConfigError(f"{where}: {e}") from None
    if scheme not in ("http", "https") or not host:
        raise ConfigError(f"{where}: http://host:port or https://host expected")
    if not _ip_address(host):
        try:
            name = host.encode("idna")
        except UnicodeError as e:
            raise ConfigError(f"{where}: its host name is not one ({e})") from None
        if len(name) > 253:
            raise ConfigError(f"{where}: its host name is {len(name)} bytes long, more than the 253 a name may have")
    return scheme, host, port or {"http": 80, "https": 443}[scheme]


def _ip_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _proxied(scheme: str, host: str) -> bool:
    """Whether the environment sends requests for this host through a proxy (then the client
    connects to the proxy, not to the host, and a direct probe would tell nothing)."""
    proxies = urllib.request.getproxies()
    return bool(proxies.get(scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(host)
