"""When cameras fire: bursts of events separated by idle gaps, busier in local daytime.

Each camera runs on its own, alternating two states:

- **a burst** (an episode: someone at the door, a car in the driveway): a number of events
  drawn geometrically with mean `burst_events` (at least one), the next one starting after an
  exponential gap of mean `burst_gap`. A burst is a person episode with probability
  PERSON_EPISODE; the generator marks its events has_person accordingly.
- **an idle gap** before the next burst: exponential with mean `idle_gap` in the camera's local
  daytime (07:00-22:00) and `day_night_factor` times longer at night. Precisely, the gap is an
  exponential amount of "activity time" with mean `idle_gap`, which a day hour accrues at 1 and
  a night hour at 1/day_night_factor, so a gap that runs into the night stretches there.

Local time is the camera's location (LOCATIONS in the generator, by device index; unknown
devices are placed the same way) at a fixed standard-time UTC offset: no daylight saving.

With the defaults (5 events a minute apart, idle 45 min by day, 4x at night) a camera is idle
most of the time, about 100 events a day, and with a 30-minute session gap half its idle gaps
by day close a session: sessions last from a few minutes to an hour or two.

The camera timelines are merged in time order, and the first N events are the feed, so its
natural span follows from N and the device count. A caller that needs N events in a given span
(a load test) gets the same timeline squeezed or stretched linearly to fill it: bursts keep
their shape relative to each other, but their durations, and the day/night alignment, scale.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from random import Random
from typing import Iterator

DAY_START_H, DAY_END_H = 7, 22
PERSON_EPISODE = 0.35
_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS


@dataclass(frozen=True)
class Rhythm:
    burst_events: float      # mean events per burst, >= 1
    burst_gap_s: float       # mean gap between event starts within a burst
    idle_gap_s: float        # mean idle gap between bursts in local daytime
    day_night_factor: float  # idle gaps are this much longer at night


# An event is a plain tuple (a million of them are built for the bench): start time in epoch ms,
# index of its camera in the lists given to timeline(), whether it is part of a person episode.
Event = tuple[int, int, bool]


def is_daytime(t_ms: int, utc_offset_h: int) -> bool:
    return DAY_START_H <= ((t_ms + utc_offset_h * _HOUR_MS) % _DAY_MS) // _HOUR_MS < DAY_END_H


def _next_switch(t_ms: int, utc_offset_h: int) -> int:
    """The next local 07:00 or 22:00 strictly after t_ms."""
    local = t_ms + utc_offset_h * _HOUR_MS
    midnight = local - local % _DAY_MS
    for h in (DAY_START_H, DAY_END_H, 24 + DAY_START_H):
        if midnight + h * _HOUR_MS > local:
            return midnight + h * _HOUR_MS - utc_offset_h * _HOUR_MS
    raise AssertionError("unreachable")


def idle_end(t_ms: int, utc_offset_h: int, rhythm: Rhythm, rng: Random, weight: float) -> int:
    """When an idle gap starting at t_ms ends; `weight` scales the camera's activity."""
    work = rng.expovariate(1.0) * rhythm.idle_gap_s * 1000 / weight   # in daytime ms
    while True:
        rate = 1.0 if is_daytime(t_ms, utc_offset_h) else 1.0 / rhythm.day_night_factor
        switch = _next_switch(t_ms, utc_offset_h)
        if work <= (switch - t_ms) * rate:
            return t_ms + int(work / rate)
        work -= (switch - t_ms) * rate
        t_ms = switch


def camera(device: int, start_ms: int, utc_offset_h: int, rhythm: Rhythm, weight: float,
           rng: Random) -> Iterator[Event]:
    """One camera's events, forever, from start_ms."""
    t = start_ms
    stop = 1.0 / rhythm.burst_events   # geometric burst length with mean burst_events
    while True:
        t = idle_end(t, utc_offset_h, rhythm, rng, weight)
        person = rng.random() < PERSON_EPISODE
        yield t, device, person
        while rng.random() >= stop:
            t += int(rng.expovariate(1.0) * rhythm.burst_gap_s * 1000)
            yield t, device, person


def timeline(n: int, start_ms: int, offsets_h: list[int], weights: list[float], rhythm: Rhythm,
             seed: int) -> list[Event]:
    """The first n events of all cameras merged in time order, start times strictly increasing.

    Each camera draws from its own generator seeded by (seed, camera), so a camera's timeline
    does not depend on how many others there are or on n. Cameras with weight 0 never fire."""
    cams = [camera(i, start_ms, offsets_h[i], rhythm, w, Random(f"{seed}:activity:{i}"))
            for i, w in enumerate(weights) if w > 0]
    if not cams:
        raise ValueError("no camera can fire: every activity weight is 0")
    heap = [(next(c), k) for k, c in enumerate(cams)]
    heapq.heapify(heap)
    out: list[Event] = []
    last = start_ms - 1
    while len(out) < n:
        (t, device, person), k = heap[0]
        # Equal milliseconds would make equal event ids for one device, and ties in stream order.
        last = t if t > last else last + 1
        out.append((last, device, person))
        heapq.heapreplace(heap, (next(cams[k]), k))
    return out


def fit(events: list[Event], start_ms: int, span_ms: int) -> list[Event]:
    """The same events linearly rescaled into [start_ms, start_ms + span_ms), still increasing."""
    if len(events) > span_ms:
        raise ValueError(f"{len(events)} events do not fit in a span of {span_ms} ms at 1 ms apart")
    natural = events[-1][0] - start_ms + 1
    out, last = [], start_ms - 1
    for i, (t, device, person) in enumerate(events):
        t = start_ms + (t - start_ms) * span_ms // natural
        # Keep room for the events still to come; room is there since len(events) <= span_ms.
        last = min(max(t, last + 1), start_ms + span_ms - (len(events) - i))
        out.append((last, device, person))
    return out
