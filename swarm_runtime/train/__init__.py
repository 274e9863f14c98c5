"""Training: SFT cold start, REINFORCE on actions, counterfactual Bradley-Terry on bids."""
