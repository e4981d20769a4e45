"""The harness's pieces on the public API (issue #30): the transport the spec schedules
(``wire``), the subject and its actions (``subject``, ``actions``), the adapter and what
it cannot run (``adapter``), the tour of the spec closed under the API's eager steps
(``tour``) and the divergence classes it finds today (``gaps``)."""

from refimpl.testing.on_api.adapter import UNEXPRESSED, ApiAdapter, unexpressed
from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour

__all__ = ["UNEXPRESSED", "ApiAdapter", "api_report", "plan_api", "run_api_tour", "unexpressed"]
