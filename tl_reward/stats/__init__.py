"""Statistics shared by the analyses: resampling (bootstrap, sign-flip) and rank agreement."""
