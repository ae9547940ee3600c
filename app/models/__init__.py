"""All ORM models; importing this package registers every table on ``Base.metadata``."""

from app.models.base import Base, UTCDateTime, utcnow
from app.models.boost import BOOST_STATUSES, QuotaBoost
from app.models.finding import AuditLog, Finding, Notice
from app.models.health import DeviceQuarantine
from app.models.idempotency import IdempotencyKey
from app.models.identity import NOTICE_KINDS, NoticePreference, NotifyTarget
from app.models.host import Device, DeviceConflict, DeviceProcess, DeviceTelemetry, Host, HostSnapshot, UsageRollup
from app.models.reservation import Reservation, ReservationDevice, ReservationSeries, ReservationShare
from app.models.rule import SharingRule
from app.models.user import ApiToken, Group, GroupMember, LoginAttempt, User, WebSession
from app.models.waitlist import WaitlistEntry, WaitlistStatus

__all__ = [
    "Base", "UTCDateTime", "utcnow", "AuditLog", "DeviceQuarantine", "Finding", "Notice", "Device", "DeviceConflict", "DeviceProcess",
    "DeviceTelemetry", "Host", "HostSnapshot", "UsageRollup", "Reservation", "ReservationDevice",
    "ReservationSeries", "ReservationShare", "SharingRule", "ApiToken", "Group", "GroupMember",
    "LoginAttempt", "User", "WebSession", "IdempotencyKey", "NOTICE_KINDS", "NoticePreference", "NotifyTarget",
    "BOOST_STATUSES", "QuotaBoost",
    "WaitlistEntry", "WaitlistStatus",
]
