"""Support shared by the tests and the benchmarks: a fake ``pynvml`` with named scenarios
(:mod:`testkit.fake_nvml`), live ``gpuroster serve`` processes (:mod:`testkit.live`) and
throw-away PostgreSQL databases (:mod:`testkit.pg`). Not part of the installed package."""
