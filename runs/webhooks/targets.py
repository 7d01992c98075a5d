"""Where a webhook may be sent (the SSRF rule): http or https only, no credentials in the URL, and every address
its host resolves to public: not private, loopback, link-local, multicast, reserved or unspecified, IPv4 or
IPv6, an IPv4-mapped IPv6 address judged as its IPv4 one. Checked at subscribe time (a 400 naming `url`) and at
every delivery, which then connects to the very address checked here (runs/webhooks/send.py), so a name that
resolves elsewhere a second time (DNS rebinding) cannot reach an internal address.

Private targets (a receiver on this machine or the cluster's network) are allowed only by staff: the setting
WEBHOOKS_ALLOW_PRIVATE_TARGETS or a staff subscription's `allow_private`."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

URL_MAX = 2048
SCHEMES = {"http": 80, "https": 443}


class TargetRefused(ValueError):
    """The URL may not be a webhook's target; the message says why (it names no address it resolved to)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written (the Host header and the TLS server name)
    port: int
    path: str  # path and query
    address: str  # the checked address to connect to


def url_parse(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path?query) of an acceptable URL, or TargetRefused."""
    if not isinstance(url, str) or not url or len(url) > URL_MAX:
        raise TargetRefused(f"must be a URL of at most {URL_MAX} characters")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise TargetRefused("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise TargetRefused("must be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("must not carry credentials")
    host = parts.hostname or ""
    if not host:
        raise TargetRefused("must name a host")
    path = parts.path or "/"
    return scheme, host, port or SCHEMES[scheme], f"{path}?{parts.query}" if parts.query else path


def address_refused(address: str) -> str | None:
    """Why this address may not be a target (None: a public address)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for why in ("private", "loopback", "link_local", "multicast", "reserved", "unspecified"):
        if getattr(ip, f"is_{why}"):
            return why.replace("_", "-")
    if not ip.is_global:
        return "not global"
    return None


def target_resolve(url: str, *, allow_private: bool) -> Target:
    """The URL's target with the address to connect to: the first it resolves to, all of them checked (one bad
    address refuses the URL: a resolver may answer either). TargetRefused when it is not acceptable."""
    scheme, host, port, path = url_parse(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise TargetRefused(f"host {host!r} does not resolve") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise TargetRefused(f"host {host!r} does not resolve")
    if not allow_private:
        for address in addresses:
            why = address_refused(address)
            if why is not None:
                raise TargetRefused(f"host {host!r} resolves to a {why} address; webhooks go to public addresses")
    return Target(scheme=scheme, host=host, port=port, path=path, address=addresses[0])
