"""POST /webhooks/{source}: a delivery read, verified, planned, claimed and answered."""
