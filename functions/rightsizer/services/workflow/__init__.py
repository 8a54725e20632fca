"""The act side's workflow machinery (issue 25): one engine that runs any kind's step table."""
