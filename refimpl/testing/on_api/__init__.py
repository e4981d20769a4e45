"""The harness's pieces on the public API (issue #30): the transport the spec schedules
(``wire``), the subject and its actions (``subject``, ``actions``), the adapter
(``adapter``) and the tour of the spec closed under the API's eager steps (``tour``)."""
