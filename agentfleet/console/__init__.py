"""The console: a small server-rendered web app over ``ops/`` — runs, a run's tree and trace, approvals, dead
letters, the fleet, activity — live by Server-Sent Events, behind sign-in and CSRF (``agentfleet console``)."""
