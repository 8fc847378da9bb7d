"""The secrets of the schemes' end-to-end gateway, one environment variable per scheme, and the path its loopback
server serves PayPal's certificate under: the gateways of test_schemes_e2e, test_send_e2e, test_replay_attacks and
the penalty box's tests take their secrets from here."""

from __future__ import annotations

import base64

SECRETS = {
    "STRIPE_SECRET": "whsec_e2e_stripe_secret_4f1c",
    "GITHUB_SECRET": "e2e-github-secret-8d2e",
    "SVIX_SECRET": "whsec_" + base64.b64encode(b"e2e svix secret of 32 bytes!!!!!").decode(),
    "SHOPIFY_SECRET": "shpss_e2e_shopify_secret_55a0",
    "SLACK_SECRET": "e2e-slack-signing-secret-9b7f",
    "HMAC_SECRET": "e2e-generic-hmac-secret-1c3d",
    "TWILIO_SECRET": "e2e-twilio-auth-token-7e6a",
    "PAYPAL_WEBHOOK_ID": "8PT597110X687430LKGECATA",
    "ADYEN_HMAC_KEY": "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
}
CERT_PATH = "/v1/notifications/certs/CERT-360caa42-fca2a594-e2e"
