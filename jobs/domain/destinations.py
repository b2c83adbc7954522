"""Where notifications may go, and git repositories be fetched from: never the portal's own
machine, nor a private, loopback, link-local or other address that is not the Internet's, unless
an admin allows its network (for notifications: settings.RINGMASTER_NOTIFY_ALLOWED_NETWORKS and
the admin's NotifyAllowedNetwork rows; for git, a list apart, as a fetch reads from there:
RINGMASTER_GIT_ALLOWED_NETWORKS and GitAllowedNetwork rows).

A notification target's host is checked when it is saved and again, after its name is resolved, right
before each delivery (a name may resolve elsewhere later): a user cannot make the portal's
workers reach its database, its metadata service or an intranet service on their behalf.
"""
import ipaddress
import socket

import psutil
from django.conf import settings

from jobs.models import GitAllowedNetwork, NotifyAllowedNetwork


class Refused(Exception):
    """A destination the portal does not send to; its message says why, for the user."""


class Unresolved(Refused):
    """A host name that resolves to no address (now: it may later)."""


def allowed_networks(texts=None):
    """The networks of `texts` (address ranges); none given: those allowed for notifications."""
    if texts is None:
        texts = [*settings.RINGMASTER_NOTIFY_ALLOWED_NETWORKS,
                 *NotifyAllowedNetwork.objects.values_list("network", flat=True)]
    networks = []
    for text in texts:
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            continue                  # the admin's form refuses these; a bad entry of the setting is left out
    return networks


def git_allowed_networks():
    """The networks git repositories may be fetched from although they are not the Internet's."""
    return allowed_networks([*settings.RINGMASTER_GIT_ALLOWED_NETWORKS,
                             *GitAllowedNetwork.objects.values_list("network", flat=True)])


def own_addresses():
    """Every address of this machine's interfaces."""
    found = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    found.add(ipaddress.ip_address(address.address.split("%")[0]))
                except ValueError:
                    continue
    return found


def _plain(address):
    """An IPv4 address written as IPv6 (::ffff:10.0.0.1) is that IPv4 address."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def refused_kind(address, allowed=None, own=None):
    """What `address` (an ipaddress object) is, where notifications may not go ("a loopback
    address", ...), or "" when they may."""
    address = _plain(address)
    allowed = allowed_networks() if allowed is None else allowed
    if any(address.version == network.version and address in network for network in allowed):
        return ""
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address in (own_addresses() if own is None else own):
        return "an address of the portal's own machine"
    if address.is_private or address.is_unspecified or address.is_reserved:
        return "a private address"
    if address.is_multicast or not address.is_global:
        return "an address that is not on the Internet"
    return ""


UNLESS = "notifications may not go there unless an admin allows its network"
GIT_UNLESS = "git repositories are not fetched from there unless an admin allows its network"


def resolve(host, port=None):
    """The addresses `host` (a name or an address) resolves to, in the resolver's order.
    Raises Refused when it resolves to none."""
    host = host.strip("[]")
    try:
        return [_plain(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        raise Unresolved(f"{host} does not resolve ({getattr(exc, 'strerror', None) or exc})") from None
    addresses = []
    for info in infos:
        address = _plain(ipaddress.ip_address(info[4][0].split("%")[0]))
        if address not in addresses:
            addresses.append(address)
    return addresses


def checked(host, port=None, allowed=None, own=None, unless=UNLESS):
    """The addresses of `host`, every one of them allowed; else Refused saying why (ending in
    `unless`). `allowed` and `own` (allowed_networks(), own_addresses()) are read now unless
    given: a caller that checks from a thread with no database connection of its own reads them
    first; git's caller gives git_allowed_networks()."""
    addresses = resolve(host, port)
    allowed = allowed_networks() if allowed is None else allowed
    own = own_addresses() if own is None else own
    for address in addresses:
        kind = refused_kind(address, allowed, own)
        if kind and str(address) == host.strip("[]"):
            raise Refused(f"{address} is {kind}: {unless}")
        if kind:
            raise Refused(f"{host} resolves to {address}, {kind}: {unless}")
    return addresses
