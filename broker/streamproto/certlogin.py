"""SASL EXTERNAL with TLS client certificates, as RabbitMQ's rabbitmq_auth_mechanism_ssl: the
user name is the certificate subject's distinguished name (RabbitMQ's default
`ssl_cert_login_from = distinguished_name`), written as rabbit_cert_info writes it: the RDNs
in reverse order, `TYPE=value` joined by ",", values escaped as RFC 4514 says
(`/O=client/CN=app` logs in as `CN=app,O=client`).

`login_name(cert, verify_peer)` answers the name, or the reason EXTERNAL is refused (no
certificate; peer verification off, which RabbitMQ calls unsafe). `cert_info` gives the
management API's peer_cert_* items. Input is the dict of `SSLObject.getpeercert()`.
Must not know: frames, users. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Python's long attribute names -> rabbit_cert_info's short ones
_SHORT = {
    "surname": "SN", "givenName": "GIVENNAME", "initials": "INITIALS",
    "generationQualifier": "GENERATIONQUALIFIER", "commonName": "CN",
    "localityName": "L", "stateOrProvinceName": "ST", "organizationName": "O",
    "organizationalUnitName": "OU", "title": "TITLE", "countryName": "C",
    "serialNumber": "SERIALNUMBER", "pseudonym": "PSEUDONYM", "domainComponent": "DC",
    "emailAddress": "EMAILADDRESS", "streetAddress": "STREET", "userId": "UID",
}
_SPECIAL = set('"+,;<>\\')


class Refused(Exception):
    """EXTERNAL cannot log in; the text says why (logged, not sent)."""


def _escape(value: str) -> str:
    out = []
    for i, char in enumerate(value):
        if (i == 0 and char in " #") or char in _SPECIAL:
            out.append("\\" + char)
        elif ord(char) < 32 or ord(char) >= 126:
            out.extend(f"\\{b:02X}" for b in char.encode("utf-8"))
        else:
            out.append(char)
    if value.endswith(" ") and len(value) > 1:
        out[-1] = "\\ "
    return "".join(out)


def distinguished_name(rdns: Iterable[Iterable[tuple[str, object]]] | None) -> str:
    """rabbit_cert_info:format_rdn_sequence of getpeercert()'s subject or issuer."""
    parts = []
    for rdn in reversed(list(rdns or ())):
        parts.append("+".join(f"{_SHORT.get(key, key)}={_escape(str(value))}"
                              for key, value in rdn))
    return ",".join(parts)


def login_name(cert: dict[str, Any] | None, verify_peer: bool) -> str:
    if not verify_peer:
        raise Refused("TLS configuration is unsafe")
    if not cert:
        raise Refused("connection peer presented no TLS (x.509) certificate")
    name = distinguished_name(cert.get("subject"))
    if not name:
        raise Refused("no name found")
    return name


def cert_info(cert: dict[str, Any] | None) -> dict[str, Any] | None:
    if not cert:
        return None
    return {
        "subject": distinguished_name(cert.get("subject")),
        "issuer": distinguished_name(cert.get("issuer")),
        "serial_number": cert.get("serialNumber"),
        "validity": f"{cert.get('notBefore')} - {cert.get('notAfter')}",
    }
