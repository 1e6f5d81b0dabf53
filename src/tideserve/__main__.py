from tideserve.cli.main import app

app()
