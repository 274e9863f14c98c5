"""Training: the losses, the optimizer, SFT, REINFORCE on actions, counterfactual Bradley-Terry on bids, MPT, the monolithic baseline, sharded learners and RLCR."""
