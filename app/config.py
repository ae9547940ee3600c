"""Service settings (pydantic-settings, prefix ``GPUROSTER_``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_PLACEHOLDERS = {"", "changeme", "change-me", "secret", "please-change", "xxx"}


def normalize_database_url(url: str) -> str:
    """Map plain ``sqlite:///…`` and ``postgresql://…`` URLs onto the drivers the service uses.

    ``postgres://`` and ``postgresql://`` become ``postgresql+psycopg://`` (psycopg 3);
    SQLite URLs keep the standard library driver. Other explicit drivers are left alone.
    """
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://"):]
    if url.startswith("sqlite+pysqlite://"):
        return "sqlite://" + url[len("sqlite+pysqlite://"):]
    return url


class Settings(BaseSettings):
    """All service configuration; each field reads ``GPUROSTER_<NAME>`` from the environment."""

    model_config = SettingsConfigDict(env_prefix="GPUROSTER_", env_file=None, extra="ignore")

    environment: str = Field(default="development", description="development | production | test")
    data_dir: Path = Field(default=Path("data"), description="where the SQLite default and spools live")
    database_url: str | None = Field(default=None, description="sqlite:///… or postgresql://…")
    timezone: str = Field(default="UTC", description="the lab's IANA zone, for display and calendar rules")
    secret_key: str = Field(default="dev-insecure-secret", description="signs CSRF tokens; required in production")
    base_url: str = Field(default="http://127.0.0.1:8000", description="public URL, used in notices and feeds")
    max_body_bytes: int = Field(default=256 * 1024)
    page_size_max: int = Field(default=500, ge=1)
    # Reservations
    min_reservation_seconds: int = Field(default=60, ge=1)
    # SQLite tuning
    sqlite_busy_timeout_ms: int = Field(default=30_000, ge=0)
    # Connection pool of each server process (SQLAlchemy QueuePool)
    db_pool_size: int | None = Field(
        default=None, ge=1, description="connections kept open per process; unset: 10 on PostgreSQL, 20 on SQLite")
    db_pool_overflow: int = Field(default=20, ge=0, description="extra connections a process may open under load")
    db_pool_timeout_seconds: float = Field(
        default=30.0, gt=0, description="seconds a request waits for a free connection before it is answered 503 busy")
    # Sessions / sign-in
    session_hours: int = Field(default=12, ge=1)
    login_max_attempts: int = Field(default=5, ge=1, description="failed sign-ins per user+address per window")
    login_window_seconds: int = Field(default=300, ge=1)
    login_max_attempts_per_account: int = Field(default=20, ge=1, description="failed sign-ins per user from all addresses per window")
    login_max_attempts_per_address: int = Field(default=10, ge=1, description="failed sign-ins per address across all usernames per window")
    trusted_proxies: str = Field(default="", description="comma-separated addresses/CIDRs whose X-Forwarded-For/-Proto are believed")
    # Browser and scrape hardening
    hsts_seconds: int = Field(default=31_536_000, ge=0, description="Strict-Transport-Security max-age on HTTPS responses; 0 sends none")
    metrics_token: str | None = Field(default=None, description="when set, /metrics needs 'Authorization: Bearer <token>'")
    db_retry_after_seconds: int = Field(default=5, ge=1, description="Retry-After of the 503 sent while the database is away")
    pgbouncer: bool = Field(default=False, description="the database URL points at PgBouncer in transaction mode")
    background_start_delay_seconds: float = Field(
        default=0.0, ge=0, description="seconds after start before the periodic jobs (expiry of unapproved pending"
        " reservations, the waitlist round, the check-in sweep, the history pruner, the flush of API-token use) run a"
        " first round; each then"
        " repeats at its own period")
    ingest_batch_max: int = Field(
        default=32, ge=1, le=1000, description="most agent snapshots one serve process commits in one transaction:"
        " the snapshots that arrive while one is written share the next (1: each alone)")
    # Health quarantine (docs/rules.md)
    health_self_clear_seconds: int = Field(
        default=300, ge=0, description="a quarantine for thermal/power slowdown lifts after the device reports this long without it")
    # Notices
    smtp_host: str | None = None
    smtp_port: int = 25
    smtp_from: str = "gpuroster@localhost"
    smtp_username: str | None = None
    smtp_password: str | None = None
    smtp_starttls: bool = False
    webhook_url: str | None = None
    notify_urls: list[str] = Field(default_factory=list, description="deployment-wide apprise URLs (JSON list)")
    # LDAP sign-in (app/services/ldap_auth.py; docs/auth.md)
    ldap_url: str | None = Field(default=None, description="ldap://host:389 or ldaps://host:636; unset: no LDAP")
    ldap_starttls: bool = Field(default=False, description="upgrade ldap:// with StartTLS before binding")
    ldap_ca_file: Path | None = Field(default=None, description="CA bundle for LDAPS/StartTLS")
    ldap_tls_verify: bool = Field(default=True, description="verify the directory's certificate")
    ldap_bind_dn: str | None = Field(default=None, description="service account that searches users")
    ldap_bind_password: str | None = None
    ldap_user_base: str = Field(default="", description="search base for users, e.g. ou=people,dc=lab,dc=org")
    ldap_user_filter: str = Field(default="(&(objectClass=posixAccount)(uid={username}))")
    ldap_email_attr: str = "mail"
    ldap_uid_attr: str = "uidNumber"
    ldap_unix_name_attr: str = "uid"
    ldap_display_name_attr: str = "cn"
    ldap_group_base: str | None = Field(default=None, description="search base for groups; unset: no group sync")
    ldap_group_filter: str = Field(default="(|(memberUid={username})(member={dn})(uniqueMember={dn}))")
    ldap_group_name_attr: str = "cn"
    ldap_groups: dict[str, str] = Field(default_factory=dict, description="directory group -> gpuroster group (JSON)")
    ldap_admin_group: str | None = Field(default=None, description="directory group whose members are admins")
    ldap_manager_groups: dict[str, str] = Field(
        default_factory=dict, description="directory group -> gpuroster group its members manage (JSON)")
    ldap_timeout_seconds: float = Field(default=5.0, gt=0)
    # OIDC sign-in (app/services/oidc.py; docs/auth.md)
    oidc_discovery_url: str | None = Field(default=None, description=".../.well-known/openid-configuration; unset: no OIDC")
    oidc_client_id: str | None = None
    oidc_client_secret: str | None = None
    oidc_scopes: str = "openid profile email"
    oidc_label: str = Field(default="single sign-on", description="the button's name on the sign-in page")
    oidc_username_claim: str = "preferred_username"
    oidc_email_claim: str = "email"
    oidc_groups_claim: str = "groups"
    oidc_groups: dict[str, str] = Field(default_factory=dict, description="provider group -> gpuroster group (JSON)")
    oidc_admin_group: str | None = None
    oidc_manager_groups: dict[str, str] = Field(
        default_factory=dict, description="provider group -> gpuroster group its members manage (JSON)")
    oidc_timeout_seconds: float = Field(default=10.0, gt=0)
    # History
    rollup_retention_days: int = Field(default=90, ge=1)
    snapshot_seq_retention_days: int = Field(default=7, ge=1)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise ValueError(f"GPUROSTER_TIMEZONE: unknown IANA time zone {v!r}") from e
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: str) -> str:
        import ipaddress

        for item in (p.strip() for p in v.split(",")):
            if item:
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError as e:
                    raise ValueError(f"GPUROSTER_TRUSTED_PROXIES: {item!r} is not an address or CIDR network") from e
        return v

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> "Settings":
        if self.environment == "production" and (
            self.secret_key.lower() in _PLACEHOLDERS or self.secret_key == "dev-insecure-secret" or len(self.secret_key) < 16
        ):
            raise ValueError("GPUROSTER_SECRET_KEY must be set to a random value of 16+ characters in production")
        return self

    @property
    def sqlalchemy_url(self) -> str:
        """The SQLAlchemy URL: the configured one normalised, or ``sqlite:///<data_dir>/gpuroster.db``."""
        if self.database_url:
            return normalize_database_url(self.database_url)
        return f"sqlite:///{(self.data_dir / 'gpuroster.db').resolve()}"

    @property
    def trusted_proxy_list(self) -> list[str]:
        """``trusted_proxies`` split on commas (addresses or CIDR networks; empty: trust none)."""
        return [p.strip() for p in self.trusted_proxies.split(",") if p.strip()]

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


@lru_cache
def get_settings() -> Settings:
    """Settings read once per process (tests call ``get_settings.cache_clear()``)."""
    return Settings()
