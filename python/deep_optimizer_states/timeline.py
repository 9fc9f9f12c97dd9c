"""The update phases' figures and timelines of
:class:`~deep_optimizer_states.optimizer.DeepOptimizerStates`: each ended phase's stats as a dict,
with its tasks when the runtime records them, and the ``timeline`` switch. A mixin: the optimizer's
constructor sets up what these methods read (``_buckets``, ``_settings``, ``_overlap_lock``).
"""

from . import _capi


class _Timeline:
    """The phases' figures (``_phase_stats``) and the ``timeline`` switch."""

    def _phase_stats(self, b, st):
        """The figures of the phase of bucket ``b`` that just ended (``st``, a :class:`_capi.StepStats`)
        as a dict; with ``timeline=True`` also ``started_at`` (when the phase began, on
        ``time.perf_counter()``'s clock, s) and ``timeline`` (its tasks: dicts of ``lane``, ``what``,
        ``subgroup``, ``start``, ``end``, seconds since ``started_at``)."""
        d = st.as_dict()
        if b.timeline_on:
            started, tasks = _capi.last_timeline(b.handle)
            d["started_at"] = started - _capi.clock_offset()
            d["timeline"] = tasks
        self._apply_timeline(b)
        return d

    @property
    def timeline(self):
        """Whether the update phases record their tasks (bool; see the constructor's ``timeline``).
        Setting it takes effect from each bucket's next phase; raises ``ValueError`` for a
        non-bool."""
        return self._settings["timeline"]

    @timeline.setter
    def timeline(self, on):
        if not isinstance(on, bool):
            raise ValueError(f"timeline must be True or False, got {on!r}")
        self._settings["timeline"] = on

    def _apply_timeline(self, b):
        """Turns the runtime's timeline of bucket ``b`` on or off as :attr:`timeline` says, when no
        phase of ``b`` is open or running (else at the end of that phase)."""
        want = bool(self.timeline)
        with self._overlap_lock:
            if b.timeline_on != want and not b.open and not b.running:
                _capi.check(_capi.lib().dos_optimizer_set_timeline(b.handle, int(want)),
                            f"turning the timeline of {b.describe()} {'on' if want else 'off'}")
                b.timeline_on = want
