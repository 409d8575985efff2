"""Click models of the chain's users, in one place: the position-based model fitted by maximum
likelihood (``position_based``), the expected and sampled page feedback of a position-based
model (``feedback``), and the fit to the training logs that page GRPO uses as R_old
(``logged``). The simulator's own users are ``chain.world.catalogue.ClickModel``."""
