"""Locust's run time (-t) is a gevent timer, and gevent times a timer from its loop's clock, which it reads only
when the loop turns. Loading a locustfile (tritonclient, numpy, our clients) blocks the loop for a second or more,
and several on a busy host, so the timer was set from a clock that many seconds old and the run was cut short by
as much: measured, a 3 s run stopped 0.18 s after its users started, with no request done. Locustfiles import this
module; it reads the clock afresh once Locust is set up, just before it starts the run and its timer."""

from locust import events


@events.init.add_listener
def fresh_loop_clock(**_) -> None:
    import gevent

    gevent.get_hub().loop.update_now()
