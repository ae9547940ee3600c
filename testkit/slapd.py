"""A throwaway OpenLDAP server (Debian's ``slapd``) on a free loopback port.

:func:`running_slapd` writes a ``cn=config`` LDIF (the mdb backend, the core, cosine, nis
and inetOrgPerson schemas, a suffix with a root DN), loads it and the fixture directory with
``slapadd`` into a temporary ``slapd.d``, starts ``slapd`` in the foreground on
``ldap://127.0.0.1:<port>`` and stops it on exit. No debconf, no system configuration is
touched. Tests skip (fail under CI) when ``slapd`` is not installed.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testkit.live import free_port

SUFFIX = "dc=lab,dc=test"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PW = "root-secret"
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIRS = (Path("/usr/lib/ldap"), Path("/usr/lib/x86_64-linux-gnu/ldap"), Path("/usr/lib64/openldap"))


def slapd_binary() -> str | None:
    """Path of ``slapd`` (it lives in ``/usr/sbin``, often outside a user's PATH)."""
    return shutil.which("slapd") or next((str(p) for p in (Path("/usr/sbin/slapd"),) if p.exists()), None)


@dataclass(frozen=True)
class Slapd:
    """A running server: its URLs, the root DN/password that may modify it, and with TLS the
    CA file that signed its certificate (``ldaps_url`` and ``ca_file`` are ``None`` without)."""

    url: str
    port: int
    root_dn: str
    root_pw: str
    workdir: Path
    ldaps_url: str | None = None
    ca_file: Path | None = None

    def modify(self, ldif: str) -> None:
        """Apply an LDIF change with ``ldapmodify`` as the root DN."""
        subprocess.run(["ldapmodify", "-x", "-H", self.url, "-D", self.root_dn, "-w", self.root_pw],
                       input=ldif, text=True, check=True, capture_output=True, timeout=30)


def make_tls_files(workdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost: (ca, cert, key) PEM files."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuroster test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (workdir / "ca.pem", workdir / "cert.pem", workdir / "key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def _config_ldif(workdir: Path, tls: tuple[Path, Path, Path] | None = None) -> str:
    module_dir = next((d for d in MODULE_DIRS if (d / "back_mdb.la").exists() or (d / "back_mdb.so").exists()), None)
    module = (f"dn: cn=module{{0}},cn=config\nobjectClass: olcModuleList\ncn: module{{0}}\n"
              f"olcModulePath: {module_dir}\nolcModuleLoad: back_mdb\n\n") if module_dir else ""
    includes = "".join(f"include: file://{SCHEMA_DIR / n}.ldif\n" for n in ("core", "cosine", "nis", "inetorgperson"))
    return (
        f"dn: cn=config\nobjectClass: olcGlobal\ncn: config\nolcPidFile: {workdir}/slapd.pid\n"
        + (f"olcTLSCACertificateFile: {tls[0]}\nolcTLSCertificateFile: {tls[1]}\nolcTLSCertificateKeyFile: {tls[2]}\n"
           if tls else "") + "\n"
        f"{module}"
        "dn: cn=schema,cn=config\nobjectClass: olcSchemaConfig\ncn: schema\n\n"
        f"{includes}\n"
        "dn: olcDatabase={1}mdb,cn=config\nobjectClass: olcDatabaseConfig\nobjectClass: olcMdbConfig\n"
        f"olcDatabase: {{1}}mdb\nolcSuffix: {SUFFIX}\nolcRootDN: {ROOT_DN}\nolcRootPW: {ROOT_PW}\n"
        f"olcDbDirectory: {workdir}/data\n"
        "olcAccess: {0}to attrs=userPassword by self write by anonymous auth by * none\n"
        "olcAccess: {1}to * by * read\n"
    )


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"slapd exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"slapd did not listen on 127.0.0.1:{port} within {timeout} s")


@contextmanager
def running_slapd(workdir: Path, data_ldif: str, *, tls: bool = False) -> Iterator[Slapd]:
    """Start slapd with ``data_ldif`` under ``SUFFIX`` (with ``tls``: StartTLS on the ldap://
    port and an ldaps:// port, certificate from a throwaway CA); yields a :class:`Slapd`."""
    binary = slapd_binary()
    if binary is None:
        raise FileNotFoundError("slapd is not installed (Debian: apt-get install slapd ldap-utils)")
    slapadd = str(Path(binary).with_name("slapadd")) if Path(binary).with_name("slapadd").exists() else "slapadd"
    confdir, datadir = workdir / "slapd.d", workdir / "data"
    confdir.mkdir(parents=True)
    datadir.mkdir()
    tls_files = make_tls_files(workdir) if tls else None
    (workdir / "config.ldif").write_text(_config_ldif(workdir, tls_files))
    (workdir / "data.ldif").write_text(data_ldif)
    subprocess.run([slapadd, "-n0", "-F", str(confdir), "-l", str(workdir / "config.ldif")],
                   check=True, capture_output=True, timeout=60)
    subprocess.run([slapadd, "-n1", "-F", str(confdir), "-l", str(workdir / "data.ldif")],
                   check=True, capture_output=True, timeout=60)
    # A port free when chosen can be taken before slapd binds it (outgoing connections of a
    # busy machine draw local ports from the same range), and slapd then exits at once with
    # status 1: choose new ports and start it again.
    for attempt in range(5):
        port = free_port()
        url = f"ldap://127.0.0.1:{port}"
        ldaps_url = f"ldaps://127.0.0.1:{free_port()}" if tls else None
        listen = url + "/" + (f" {ldaps_url}/" if ldaps_url else "")
        proc = subprocess.Popen([binary, "-d", "0", "-F", str(confdir), "-h", listen],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_port(port, proc)
            break
        except RuntimeError:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if attempt == 4:
                raise
    try:
        yield Slapd(url=url, port=port, root_dn=ROOT_DN, root_pw=ROOT_PW, workdir=workdir, ldaps_url=ldaps_url,
                    ca_file=tls_files[0] if tls_files else None)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
