/// Server confirmation that the authentication secret has been successfully updated.
