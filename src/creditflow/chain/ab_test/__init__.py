"""The simulated online A/B: every ranker's held-out pages shown to the simulated users
(``simulated_ab``), the controls' contrasts of what s_exp adds (``controls``) and the
report (``reporting``)."""
