"""What the closed loops of both kinds share: the loop's settings and dependencies (``loop_settings``) and the
state it reads back from status and pods (``loop_state``), and one tick from what was read to the decision
(``tick``)."""
