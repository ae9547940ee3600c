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
    """A running server: its URL and the root DN/password that may modify it."""

    url: str
    port: int
    root_dn: str
    root_pw: str
    workdir: Path

    def modify(self, ldif: str) -> None:
        """Apply an LDIF change with ``ldapmodify`` as the root DN."""
        subprocess.run(["ldapmodify", "-x", "-H", self.url, "-D", self.root_dn, "-w", self.root_pw],
                       input=ldif, text=True, check=True, capture_output=True, timeout=30)


def _config_ldif(workdir: Path) -> str:
    module_dir = next((d for d in MODULE_DIRS if (d / "back_mdb.la").exists() or (d / "back_mdb.so").exists()), None)
    module = (f"dn: cn=module{{0}},cn=config\nobjectClass: olcModuleList\ncn: module{{0}}\n"
              f"olcModulePath: {module_dir}\nolcModuleLoad: back_mdb\n\n") if module_dir else ""
    includes = "".join(f"include: file://{SCHEMA_DIR / n}.ldif\n" for n in ("core", "cosine", "nis", "inetorgperson"))
    return (
        f"dn: cn=config\nobjectClass: olcGlobal\ncn: config\nolcPidFile: {workdir}/slapd.pid\n\n"
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
def running_slapd(workdir: Path, data_ldif: str) -> Iterator[Slapd]:
    """Start slapd with ``data_ldif`` under ``SUFFIX``; yields a :class:`Slapd`, stops it after."""
    binary = slapd_binary()
    if binary is None:
        raise FileNotFoundError("slapd is not installed (Debian: apt-get install slapd ldap-utils)")
    slapadd = str(Path(binary).with_name("slapadd")) if Path(binary).with_name("slapadd").exists() else "slapadd"
    confdir, datadir = workdir / "slapd.d", workdir / "data"
    confdir.mkdir(parents=True)
    datadir.mkdir()
    (workdir / "config.ldif").write_text(_config_ldif(workdir))
    (workdir / "data.ldif").write_text(data_ldif)
    subprocess.run([slapadd, "-n0", "-F", str(confdir), "-l", str(workdir / "config.ldif")],
                   check=True, capture_output=True, timeout=60)
    subprocess.run([slapadd, "-n1", "-F", str(confdir), "-l", str(workdir / "data.ldif")],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    url = f"ldap://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "-d", "0", "-F", str(confdir), "-h", url + "/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_port(port, proc)
        yield Slapd(url=url, port=port, root_dn=ROOT_DN, root_pw=ROOT_PW, workdir=workdir)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
