"""Lambda ``alert_webhook`` (handler ``alert_webhook/app.lambda_handler``): Alertmanager webhook intake."""
