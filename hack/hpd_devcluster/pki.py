"""PKI for the local control plane: one CA, the apiserver serving cert, client certs, the service-account key.

ECDSA P-256 keys (fast to make, accepted by every Kubernetes component). Nothing here talks to the network.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

APISERVER_SANS_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
APISERVER_SANS_IP = ("127.0.0.1", "10.0.0.1")
FRONT_PROXY_CN = "front-proxy-client"


@dataclass(frozen=True)
class ClientCert:
    name: str
    common_name: str
    organization: str | None = None


CLIENTS = (
    ClientCert("admin", "hpd-admin", "system:masters"),
    ClientCert("kcm", "system:kube-controller-manager"),
    ClientCert("scheduler", "system:kube-scheduler"),
    ClientCert("kwok", "kwok-controller", "system:masters"),
    # The aggregator's client cert towards extension apiservers (the metrics adapter): they trust the identity it
    # forwards in X-Remote-User only from this CN (--requestheader-allowed-names), as kubeadm's front-proxy-client.
    ClientCert("front-proxy", FRONT_PROXY_CN),
    # The apiserver's client cert towards kubelets (logs, exec, port-forward on the real node), as kubeadm's
    # apiserver-kubelet-client.
    ClientCert("apiserver-kubelet", "kube-apiserver-kubelet-client", "system:masters"),
)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _issue(  # noqa: PLR0913 - an X.509 certificate's parts, as cryptography's builder takes them
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    *,
    is_ca: bool = False,
    usage: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not is_ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def generate(pki_dir: Path) -> None:
    """Write ca.{crt,key}, apiserver.{crt,key}, <client>.{crt,key} for CLIENTS, sa.{key,pub} into pki_dir."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("hpd-devcluster-ca")
    ca_cert = _issue(ca_name, ca_key, ca_key, ca_name, is_ca=True)
    _write_key(pki_dir / "ca.key", ca_key)
    _write_cert(pki_dir / "ca.crt", ca_cert)

    server_key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in APISERVER_SANS_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in APISERVER_SANS_IP]
    server_cert = _issue(
        _name("kube-apiserver"), server_key, ca_key, ca_name, usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans
    )
    _write_key(pki_dir / "apiserver.key", server_key)
    _write_cert(pki_dir / "apiserver.crt", server_cert)

    for client in CLIENTS:
        _issue_client(pki_dir, client, ca_key, ca_name)

    sa_key = _key()
    _write_key(pki_dir / "sa.key", sa_key)
    (pki_dir / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _issue_client(pki_dir: Path, client: ClientCert, ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name) -> None:
    key = _key()
    subject = _name(client.common_name, client.organization)
    cert = _issue(subject, key, ca_key, ca_name, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    _write_key(pki_dir / f"{client.name}.key", key)
    _write_cert(pki_dir / f"{client.name}.crt", cert)


def add_client(pki_dir: Path, client: ClientCert) -> None:
    """One more client cert from the CA that `generate` wrote (e.g. a user of its own for the operator, so the
    apiserver's audit log tells its requests apart)."""
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_name = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes()).subject
    _issue_client(pki_dir, client, ca_key, ca_name)


def add_server(pki_dir: Path, name: str, dns_names: tuple[str, ...]) -> None:
    """A serving cert <name>.{crt,key} from the CA for `dns_names` and 127.0.0.1 (an extension apiserver on loopback
    that the aggregator reaches as <service>.<namespace>.svc)."""
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_name = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes()).subject
    key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = _issue(_name(name), key, ca_key, ca_name, usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)
    _write_key(pki_dir / f"{name}.key", key)
    _write_cert(pki_dir / f"{name}.crt", cert)


def kubeconfig(server: str, pki_dir: Path, client: str) -> str:
    """A kubeconfig (YAML is a JSON superset, so JSON it is: no YAML library needed) for one client cert."""
    import json

    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "hpd-dev", "cluster": {"server": server, "certificate-authority": str(pki_dir / "ca.crt")}}
            ],
            "users": [
                {
                    "name": client,
                    "user": {
                        "client-certificate": str(pki_dir / f"{client}.crt"),
                        "client-key": str(pki_dir / f"{client}.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "hpd-dev", "context": {"cluster": "hpd-dev", "user": client, "namespace": "default"}}
            ],
            "current-context": "hpd-dev",
        },
        indent=2,
    )
