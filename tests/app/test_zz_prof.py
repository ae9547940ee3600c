import cProfile, pstats, time
from datetime import timedelta
from tests.conftest import future

def test_prof(app, client, lab, db_url, session_factory, settings):
    from app.services import reservations as svc
    from app.services import users as us
    from app.schemas.reservation import ReservationCreate
    from app.db import lock_for_write
    t0 = future(24*30)
    def one(k):
        dev, slot = k % 4, k // 4
        with session_factory() as s:
            lock_for_write(s)
            actor = us.user_for_token(s, lab.alice.token)
            data = ReservationCreate(host="node-01", devices=[dev], start=(t0 + timedelta(minutes=10*slot)).isoformat(), duration="PT10M")
            r = svc.create_reservation(s, actor=actor, data=data, settings=settings)
            svc.to_read(r).model_dump_json()
            s.commit()
    for k in range(50): one(k)
    t = time.perf_counter()
    pr = cProfile.Profile(); pr.enable()
    for k in range(50, 350): one(k)
    pr.disable()
    print("\nper booking ms (profiled)", (time.perf_counter()-t)/300*1000, db_url[:10])
    t = time.perf_counter()
    for k in range(350, 650): one(k)
    print("per booking ms", (time.perf_counter()-t)/300*1000, db_url[:10])
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
