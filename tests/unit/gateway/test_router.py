from tideserve.gateway.router import ReplicaView, choose_replica


def test_least_outstanding_wins():
    assert choose_replica([ReplicaView("a", True, 3, 8), ReplicaView("b", True, 1, 8), ReplicaView("c", True, 2, 8)]) == "b"


def test_never_a_replica_that_is_not_ready():
    assert choose_replica([ReplicaView("a", False, 0, 8), ReplicaView("b", True, 5, 8)]) == "b"
    assert choose_replica([ReplicaView("a", False, 0, 8)]) is None


def test_never_past_max_concurrency():
    assert choose_replica([ReplicaView("a", True, 8, 8), ReplicaView("b", True, 2, 2)]) is None
    assert choose_replica([ReplicaView("a", True, 7, 8)]) == "a"


def test_weighed_by_measured_service_rate():
    # A replica 4x as fast finishes a 4th request sooner ((3+1)/4 = 1) than a slow one its 2nd ((1+1)/1 = 2).
    assert choose_replica([ReplicaView("slow", True, 1, 8, service_rate=1.0),
                           ReplicaView("fast", True, 3, 8, service_rate=4.0)]) == "fast"
    assert choose_replica([ReplicaView("slow", True, 0, 8, service_rate=1.0),
                           ReplicaView("fast", True, 4, 8, service_rate=4.0)]) == "slow"


def test_ties_go_round_robin_by_least_recently_chosen():
    reps = [ReplicaView("a", True, 0, 8, last_chosen=5.0), ReplicaView("b", True, 0, 8, last_chosen=2.0)]
    assert choose_replica(reps) == "b"


def test_empty():
    assert choose_replica([]) is None
